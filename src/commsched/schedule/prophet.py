"""Prophet: gradients sent in blocks sized to fill the profiled gaps of backward.

Zhang, Zhang, et al., "Prophet: Speeding up Distributed DNN Training with
Predictable Communication Scheduling", ICPP 2021.

Backward releases gradients in bursts ("stages") separated by idle gaps. From
the profiled gradient-ready times, consecutive ready events further apart
than ``gap_factor`` × the mean gap mark a stage boundary; the gap that follows
stage k is Δ_k. When the last gradient of stage k is ready, Prophet launches
the highest-priority pending partitions (layer nearest the input first) while
their estimated transfer time fits in Δ_k (+ ``slack_ms``), stopping at the
first that does not fit; the rest waits for the next stage. After the last
stage, the remainder drains in priority order under a ``credit_mb`` window.
Updates are applied per layer before its next forward, as with ByteScheduler.

The original is a BytePS parameter-server scheduler; here blocks are
all-reduced, so a partition's transfer time is the ring all-reduce estimate
2(p-1)·α + 2(p-1)/p · n / B from the plan's network estimate (the runtime
measures B and α; ``bandwidth_gbps`` overrides B).

Guarantee: lossless. Knobs: ``partition_mb`` (4, BytePS's partition),
``credit_mb`` (16), ``gap_factor`` (2.0), ``slack_ms`` (0; v27 of the code uses 1),
``bandwidth_gbps`` (None: use the estimate).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from commsched.errors import ScheduleError
from commsched.schedule.base import Action, Launch, NetworkEstimate, Scheduler, UpdateMode
from commsched.schedule.bytescheduler import CreditQueue, partition_tasks
from commsched.schedule.fusion import ready_order
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import gbps_to_bytes_per_s, mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class ProphetKnobs(Knobs):
    policy: ClassVar[str] = "prophet"
    partition_mb: float = knob(4.0, gt=0, doc="largest partition, MiB")
    credit_mb: float = knob(16.0, gt=0, doc="bytes in flight while draining, MiB")
    gap_factor: float = knob(2.0, gt=0, doc="a ready gap this many times the mean starts a stage")
    slack_ms: float = knob(0.0, ge=0, doc="added to each gap's budget, ms")
    bandwidth_gbps: float | None = knob(None, gt=0, doc="overrides the measured bandwidth, Gbit/s")


def find_stages(workload: Workload, gap_factor: float) -> list[tuple[list[int], float]]:
    """Split tensors (in ready order) into bursts; return (tensors, gap after the burst in ms)."""
    order = ready_order(workload)
    ready = workload.grad_ready_ms
    gaps = [ready[b] - ready[a] for a, b in itertools.pairwise(order)]
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    stages: list[tuple[list[int], float]] = []
    current = [order[0]]
    for gap, t in zip(gaps, order[1:], strict=True):
        if mean_gap > 0 and gap > gap_factor * mean_gap:
            stages.append((current, gap))
            current = []
        current.append(t)
    stages.append((current, 0.0))
    return stages


class ProphetScheduler(Scheduler):
    name: ClassVar[str] = "prophet"
    knob_type: ClassVar[type[Knobs]] = ProphetKnobs
    update_mode: ClassVar[UpdateMode] = "forward"
    uses_completions: ClassVar[bool] = True

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        """The plan's network is the estimate the blocks are sized with (``bandwidth_gbps`` overrides it)."""
        assert isinstance(knobs, ProphetKnobs)
        if knobs.bandwidth_gbps is not None:
            network = replace(network, bandwidth_bytes_per_s=gbps_to_bytes_per_s(knobs.bandwidth_gbps))
        tasks, _ = partition_tasks(workload, mb_to_bytes(knobs.partition_mb))
        return CommPlan(cls.name, workload, network, tuple(tasks), "forward", knobs)

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        knobs = plan.knobs
        assert isinstance(knobs, ProphetKnobs)
        self._network = plan.network
        self._slack_s = knobs.slack_ms / 1e3
        self._queue = CreditQueue(plan, mb_to_bytes(knobs.credit_mb))
        self._stages = find_stages(plan.workload, knobs.gap_factor)
        self._stage_of_tensor = [0] * len(plan.workload.tensors)
        for k, (tensors, _) in enumerate(self._stages):
            for t in tensors:
                self._stage_of_tensor[t] = k
        self._of_tensor: list[list[int]] = [[] for _ in plan.workload.tensors]
        for task in plan.tasks:
            self._of_tensor[task.segments[0].tensor].append(task.id)
        self._missing = [len(s) for s, _ in self._stages]
        self._stages_done = 0
        self._draining = False
        self._new_iteration = False

    def _send_block(self, gap_ms: float) -> list[Action]:
        budget_s = gap_ms / 1e3 + self._slack_s
        out: list[Action] = []
        while len(self._queue):
            cost = self._network.allreduce_s(self._queue.top_bytes())
            if cost > budget_s:
                break
            budget_s -= cost
            out.append(Launch(self._queue.pop_top()))
        return out

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        if self._new_iteration:
            # Last iteration's remainder kept draining on completions until now.
            self._new_iteration = False
            self._draining = False
        for task in self._of_tensor[tensor]:
            self._queue.push(task)
        k = self._stage_of_tensor[tensor]
        self._missing[k] -= 1
        out: list[Action] = []
        # Stages normally complete in order; a late one releases the blocks of all completed ones.
        while self._stages_done < len(self._stages) and self._missing[self._stages_done] == 0:
            gap_ms = self._stages[self._stages_done][1]
            self._stages_done += 1
            if self._stages_done == len(self._stages):
                self._draining = True
                out += self._queue.drain()
            else:
                out += self._send_block(gap_ms)
        return out

    def on_backward_done(self) -> Sequence[Action]:
        if not self._draining:
            raise ScheduleError("prophet: backward done before every stage completed")
        return self._queue.drain()

    def on_comm_done(self, task: int) -> Sequence[Action]:
        self._queue.done(task)
        return self._queue.drain() if self._draining else ()

    def on_step(self) -> Sequence[Action]:
        # Keep draining: the iteration's remaining partitions are released by completions
        # until the next backward begins.
        self._missing = [len(s) for s, _ in self._stages]
        self._stages_done = 0
        self._new_iteration = True
        return ()
