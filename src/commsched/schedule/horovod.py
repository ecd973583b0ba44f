"""Horovod tensor fusion: ready tensors fused per cycle up to a threshold.

Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv 1802.05799 (2018); defaults from Horovod >= 0.21
(``HOROVOD_FUSION_THRESHOLD`` = 128 MiB, ``HOROVOD_CYCLE_TIME`` = 1 ms).

Every ``cycle_time_ms`` Horovod's background loop fuses the tensors that became
ready during the cycle (up to ``fusion_threshold_mb`` per buffer) and
all-reduces them. Horovod decides this by negotiating at run time, which is
timing-dependent; here the fusion groups are fixed when the plan is built,
from the profiled gradient-ready times (tensors whose ready times fall in the
same cycle share a buffer), so every rank issues the same collectives. A group
is launched the moment its last tensor is ready (no wait for the cycle tick,
and no negotiation cost). The optimizer runs at ``step()``.

Guarantee: lossless. Knobs: ``fusion_threshold_mb`` (128), ``cycle_time_ms`` (1.0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, ReadyTracker, Scheduler
from commsched.schedule.fusion import layer_priority, make_task, ready_order, whole
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class HorovodKnobs(Knobs):
    policy: ClassVar[str] = "horovod"
    fusion_threshold_mb: float = knob(128.0, ge=0, doc="largest fusion buffer, MiB (0: no cap)")
    cycle_time_ms: float = knob(1.0, gt=0, doc="fusion cycle, ms")


class HorovodScheduler(Scheduler):
    name: ClassVar[str] = "horovod"
    knob_type: ClassVar[type[Knobs]] = HorovodKnobs

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, HorovodKnobs)
        cycle_time_ms = knobs.cycle_time_ms
        threshold = mb_to_bytes(knobs.fusion_threshold_mb)
        ready = workload.grad_ready_ms
        groups: list[list[int]] = []
        current: list[int] = []
        current_bytes = 0
        current_cycle = -1
        for t in ready_order(workload):
            cycle = math.ceil(ready[t] / cycle_time_ms)
            nbytes = workload.tensors[t].bytes
            if current and (cycle != current_cycle or (threshold > 0 and current_bytes + nbytes > threshold)):
                groups.append(current)
                current, current_bytes = [], 0
            current.append(t)
            current_bytes += nbytes
            current_cycle = cycle
        if current:
            groups.append(current)
        tasks = []
        for i, group in enumerate(groups):
            segs = whole(workload, group)
            tasks.append(make_task(workload, i, "all_reduce", segs, f"fusion{i}", layer_priority(workload, segs)))
        return CommPlan(cls.name, workload, network, tuple(tasks), "step", knobs)

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        self._tracker = ReadyTracker(plan)

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        return [Launch(task) for task in self._tracker.mark(tensor)]

    def on_step(self) -> Sequence[Action]:
        self._tracker.reset(self.plan)
        return ()
