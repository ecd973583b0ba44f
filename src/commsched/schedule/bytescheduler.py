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
the other ranks follow its order; except where the window holds every byte
of an iteration (``credit_mb`` at least the plan's bytes: resnet5m's 20 MiB
under the default 64): then every partition launches the moment its
gradient is ready, whatever has completed, and every rank decides for
itself, as under WFBP, with no orders to wait for and no completions to
report (:meth:`ByteSchedulerScheduler.decides_on_completions`).

Guarantee: lossless. Knobs: ``partition_mb`` (32, i.e. 8 M fp32 parameters, the
value suggested for all-reduce), ``credit_mb`` (64, i.e. 16 M parameters).
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import Action, CommTask, Launch, NetworkEstimate, Scheduler, UpdateMode
from commsched.schedule.fusion import layer_priority, make_task, partition
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class ByteSchedulerKnobs(Knobs):
    policy: ClassVar[str] = "bytescheduler"
    partition_mb: float = knob(32.0, gt=0, doc="largest partition, MiB")
    credit_mb: float = knob(64.0, gt=0, doc="bytes in flight, MiB")


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

    def __init__(self, plan: CommPlan, credit_bytes: int) -> None:
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
    knob_type: ClassVar[type[Knobs]] = ByteSchedulerKnobs
    update_mode: ClassVar[UpdateMode] = "forward"
    uses_completions: ClassVar[bool] = True

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, ByteSchedulerKnobs)
        tasks, _ = partition_tasks(workload, mb_to_bytes(knobs.partition_mb))
        return CommPlan(cls.name, workload, network, tuple(tasks), "forward", knobs)

    @classmethod
    def decides_on_completions(cls, plan: CommPlan) -> bool:
        """Only where the window can fill. A partition launches while the bytes in flight are below the credit;
        in flight are at most the plan's other partitions (a layer's next forward waits for its partitions, so
        none of an earlier iteration is in flight once the next backward's gradients are ready); with a credit
        of at least the plan's bytes every partition therefore launches once ready, whatever has completed."""
        assert isinstance(plan.knobs, ByteSchedulerKnobs)
        return sum(task.bytes for task in plan.tasks) > mb_to_bytes(plan.knobs.credit_mb)

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        assert isinstance(plan.knobs, ByteSchedulerKnobs)
        # completions are not reported where they cannot change a decision: the window then never closes
        credit = mb_to_bytes(plan.knobs.credit_mb) if type(self).decides_on_completions(plan) else sys.maxsize
        self._queue = CreditQueue(plan, credit)
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
