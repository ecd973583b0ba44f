"""No overlap: one all-reduce of every gradient after backward has finished.

The naive synchronous data-parallel schedule and the upper reference for
every overlapping policy (it is also what PyTorch DDP does in its first
iteration, before it has rebuilt its buckets).

Guarantee: lossless. Knobs: ``bucket_cap_mb`` (0 = one all-reduce of everything).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, Plan, Scheduler
from commsched.schedule.fusion import fuse_by_threshold, make_task, ready_order, whole
from commsched.workload import Workload

MiB = 1024 * 1024


class NoOverlapScheduler(Scheduler):
    name: ClassVar[str] = "no_overlap"

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, bucket_cap_mb: float = 0.0) -> Plan:
        order = ready_order(workload)
        groups = [order] if bucket_cap_mb <= 0 else fuse_by_threshold(workload, order, int(bucket_cap_mb * MiB))
        tasks = tuple(
            make_task(workload, i, "all_reduce", whole(workload, g), f"bucket{i}") for i, g in enumerate(groups)
        )
        return Plan(cls.name, workload, tasks, "step", {"bucket_cap_mb": bucket_cap_mb})

    def on_backward_done(self) -> Sequence[Action]:
        return tuple(Launch(i) for i in range(len(self.plan.tasks)))
