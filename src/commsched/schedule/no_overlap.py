"""No overlap: one all-reduce of every gradient after backward has finished.

The naive synchronous data-parallel schedule and the upper reference for
every overlapping policy (it is also what PyTorch DDP does in its first
iteration, before it has rebuilt its buckets).

Guarantee: lossless. Knobs: ``bucket_cap_mb`` (0 = one all-reduce of everything).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, Scheduler
from commsched.schedule.fusion import fuse_by_threshold, make_task, ready_order, whole
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class NoOverlapKnobs(Knobs):
    policy: ClassVar[str] = "no_overlap"
    bucket_cap_mb: float = knob(0.0, ge=0, doc="bucket cap, MiB (0: one all-reduce of everything)")


class NoOverlapScheduler(Scheduler):
    name: ClassVar[str] = "no_overlap"
    knob_type: ClassVar[type[Knobs]] = NoOverlapKnobs

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, NoOverlapKnobs)
        order = ready_order(workload)
        cap = mb_to_bytes(knobs.bucket_cap_mb)
        groups = [order] if cap <= 0 else fuse_by_threshold(workload, order, cap)
        tasks = tuple(
            make_task(workload, i, "all_reduce", whole(workload, g), f"bucket{i}") for i, g in enumerate(groups)
        )
        return CommPlan(cls.name, workload, network, tasks, "step", knobs)

    def on_backward_done(self) -> Sequence[Action]:
        return tuple(Launch(i) for i in range(len(self.plan.tasks)))
