"""ByteScheduler: tensor partitioning, layer priority, credit-limited sending.

Peng et al., "A Generic Communication Scheduler for Distributed DNN Training
Acceleration", SOSP 2019.

Each tensor is cut into partitions of at most ``partition_mb``. Ready
partitions wait in a priority queue ordered by layer (the layer nearest the
input first), then by position. Partitions are launched while the bytes in
flight are below ``credit_mb`` (the check is ``in_flight < credit``, so one
launch may overshoot, as in the original); credit returns when a partition
finishes. A high-priority partition thus overtakes everything still queued but
nothing already in flight: preemption at partition boundaries. Updates are
applied per layer just before its next forward (ByteScheduler's
"cross-barrier"), so the front layers' communication overlaps the start of the
next forward.

Decisions depend on completion times, so in the runtime rank 0 decides and
the other ranks follow its order.

Guarantee: lossless. Knobs: ``partition_mb`` (32, i.e. 8 M fp32 parameters, the
value suggested for all-reduce), ``credit_mb`` (64, i.e. 16 M parameters).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

from commsched.schedule.base import Action, CommTask, Launch, NetworkEstimate, Plan, Scheduler, require_positive
from commsched.schedule.fusion import layer_priority, make_task, partition
from commsched.workload import Workload

MiB = 1024 * 1024


def partition_tasks(workload: Workload, partition_bytes: int) -> tuple[list[CommTask], list[list[int]]]:
    """One all-reduce task per partition; also returns the task ids of each tensor."""
    tasks: list[CommTask] = []
    of_tensor: list[list[int]] = []
    for t, tensor in enumerate(workload.tensors):
        ids = []
        for k, seg in enumerate(partition(workload, t, partition_bytes)):
            task_id = len(tasks)
            prio = layer_priority(workload, [seg])
            tasks.append(make_task(workload, task_id, "all_reduce", [seg], f"{tensor.name}#{k}", prio))
            ids.append(task_id)
        of_tensor.append(ids)
    return tasks, of_tensor


class CreditQueue:
    """Priority queue of partitions with a bytes-in-flight window (shared with Prophet)."""

    __slots__ = ("_heap", "_plan", "credit_bytes", "in_flight_bytes")

    def __init__(self, plan: Plan, credit_bytes: int) -> None:
        self._plan = plan
        self._heap: list[tuple[int, int]] = []
        self.credit_bytes = credit_bytes
        self.in_flight_bytes = 0

    def push(self, task: int) -> None:
        heapq.heappush(self._heap, (self._plan.tasks[task].priority, task))

    def pop_top(self) -> int:
        task = heapq.heappop(self._heap)[1]
        self.in_flight_bytes += self._plan.tasks[task].bytes
        return task

    def top_bytes(self) -> int:
        return self._plan.tasks[self._heap[0][1]].bytes

    def __len__(self) -> int:
        return len(self._heap)

    def done(self, task: int) -> None:
        self.in_flight_bytes -= self._plan.tasks[task].bytes

    def drain(self) -> list[Action]:
        """Launch in priority order while the window has room."""
        out: list[Action] = []
        while self._heap and self.in_flight_bytes < self.credit_bytes:
            out.append(Launch(self.pop_top()))
        return out


class ByteSchedulerScheduler(Scheduler):
    name: ClassVar[str] = "bytescheduler"
    uses_completions: ClassVar[bool] = True

    @classmethod
    def build_plan(
        cls, workload: Workload, network: NetworkEstimate, partition_mb: float = 32.0, credit_mb: float = 64.0
    ) -> Plan:
        require_positive(cls.name, partition_mb=partition_mb, credit_mb=credit_mb)
        tasks, _ = partition_tasks(workload, int(partition_mb * MiB))
        options = {"partition_mb": partition_mb, "credit_mb": credit_mb}
        return Plan(cls.name, workload, tuple(tasks), "forward", options)

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self._queue = CreditQueue(plan, int(float(plan.options["credit_mb"]) * MiB))
        self._of_tensor: list[list[int]] = [[] for _ in plan.workload.tensors]
        for task in plan.tasks:
            self._of_tensor[task.segments[0].tensor].append(task.id)

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        for task in self._of_tensor[tensor]:
            self._queue.push(task)
        return self._queue.drain()

    def on_comm_done(self, task: int) -> Sequence[Action]:
        self._queue.done(task)
        return self._queue.drain()
