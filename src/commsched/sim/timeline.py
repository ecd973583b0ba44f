"""One worker class's compute timeline: its state while a simulation runs, and the shape of its backward pass.

Workers with the same compute speed and batch size behave identically, so
the simulation keeps one :class:`Timeline` per
:class:`~commsched.sim.compute.WorkerClass`: where it is in the iteration,
what it is blocked on, and the CPU work it owes its compute; at the end
:func:`check_finished` says whether every timeline got through. The backward
pass is laid out once per class from the compute model's timings
(:func:`ready_batches`, :func:`backward_spans`); times are in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from commsched.errors import ScheduleError
from commsched.schedule import CommPlan, Dispatcher
from commsched.sim.compute import WorkerClass
from commsched.workload import Workload

GATE = 1  # blocked before a forward layer, on the previous iteration's final tasks
STEP = 2  # blocked after backward, on every task of the iteration


class Timeline:
    """Mutable state of one worker class."""

    __slots__ = (
        "block_k",
        "block_l",
        "blocked",
        "bstart",
        "debt_s",
        "dispatcher",
        "finished",
        "fstart",
        "in_backward",
        "in_forward",
        "leader",
        "stall_since",
        "wc",
    )

    def __init__(self, wc: WorkerClass, dispatcher: Dispatcher) -> None:
        self.wc = wc
        self.leader = wc.index == 0
        self.dispatcher = dispatcher
        self.bstart = 0.0
        self.debt_s = 0.0  # communication's CPU work not yet taken from this worker's compute
        self.blocked = 0
        self.block_k = 0
        self.block_l = 0
        self.stall_since = 0.0
        self.fstart: list[float] = []
        self.in_forward = False  # in forward (or its update), backward's end not yet known
        self.in_backward = False
        self.finished = False

    def compute_left_s(self, now_s: float, backward_s: float) -> float:
        """How much longer this class computes from ``now_s`` without a wait: what remains of its backward
        (``backward_s`` long); in forward taken as unbounded (what follows it is the backward); nothing while it
        waits or once it is done."""
        if self.blocked or self.finished:
            return 0.0
        if self.in_backward:
            return max(0.0, self.bstart + backward_s - now_s)
        return math.inf if self.in_forward else 0.0

    def describe_block(self, workload: Workload, plan: CommPlan) -> str:
        """What this class waits for, in words, for a stalled simulation's error."""
        done = self.dispatcher.done_count
        if self.blocked == GATE:
            layer = workload.layers[self.block_l].name
            final = plan.final_tasks_of_layer[self.block_l]
            missing = [plan.tasks[t].name for t in final if done[t] < self.block_k]
            return f"waits before layer {layer!r} of iteration {self.block_k} for task(s) {missing[:5]}"
        if self.blocked == STEP:
            missing = [plan.tasks[t].name for t in range(len(plan.tasks)) if done[t] <= self.block_k]
            return f"waits at step {self.block_k} for task(s) {missing[:5]}"
        return "stopped"


def check_finished(timelines: Sequence[Timeline], workload: Workload, plan: CommPlan, total: int) -> None:
    """After the event loop ran dry: every class finished its ``total`` iterations, every task completed that
    often and nothing is left held; else ScheduleError naming what stalled."""
    policy = plan.policy
    for tl in timelines:
        if not tl.finished:
            what = tl.describe_block(workload, plan)
            raise ScheduleError(
                f"{policy}: the simulation stalled: worker {tl.wc.rank} {what}; {tl.dispatcher.describe()}"
            )
    for task, count in enumerate(timelines[0].dispatcher.done_count):
        if count < total:
            raise ScheduleError(
                f"{policy}: task {plan.tasks[task].name!r} completed {count} time(s) in {total} iterations "
                "(never launched, or launched once too few)"
            )
    for tl in timelines:
        d = tl.dispatcher
        # Launches past the last iteration (from the trailing forward and flush) stay held.
        if not d.scheduler_idle or any(inst < total for _, inst in d.held):
            raise ScheduleError(f"{policy}: the simulation ended but {d.describe()}")


def ready_batches(order: Sequence[int], grad_ready_s: Sequence[float]) -> list[tuple[float, int, int]]:
    """Gradients ready at the same time, in ready ``order``: ``(offset_s, first pos, end pos)`` per ready time,
    ``offset_s`` after backward starts."""
    batches: list[tuple[float, int, int]] = []
    for pos, t in enumerate(order):
        offset = grad_ready_s[t]
        if batches and batches[-1][0] == offset:
            batches[-1] = (offset, batches[-1][1], pos + 1)
        else:
            batches.append((offset, pos, pos + 1))
    return batches


def backward_spans(backward_layer_s: Sequence[float], num_layers: int) -> list[tuple[float, float]]:
    """Per layer of ``num_layers`` ``(offset_s, duration_s)`` within backward, which runs the layers last to first
    (for the trace)."""
    layers: list[tuple[float, float]] = [(0.0, 0.0)] * num_layers
    elapsed = 0.0
    for li in range(num_layers - 1, -1, -1):
        duration = backward_layer_s[li]
        layers[li] = (elapsed, duration)
        elapsed += duration
    return layers
