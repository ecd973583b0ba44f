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
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, Plan, ReadyTracker, Scheduler, require_positive
from commsched.schedule.fusion import layer_priority, make_task, ready_order, whole
from commsched.workload import Workload

MiB = 1024 * 1024


class HorovodScheduler(Scheduler):
    name: ClassVar[str] = "horovod"

    @classmethod
    def build_plan(
        cls,
        workload: Workload,
        network: NetworkEstimate,
        fusion_threshold_mb: float = 128.0,
        cycle_time_ms: float = 1.0,
    ) -> Plan:
        require_positive(cls.name, cycle_time_ms=cycle_time_ms)
        threshold = int(fusion_threshold_mb * MiB)
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
        options = {"fusion_threshold_mb": fusion_threshold_mb, "cycle_time_ms": cycle_time_ms}
        return Plan(cls.name, workload, tuple(tasks), "step", options)

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self._tracker = ReadyTracker(plan)

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        return [Launch(task) for task in self._tracker.mark(tensor)]

    def on_step(self) -> Sequence[Action]:
        self._tracker.reset(self.plan)
        return ()
