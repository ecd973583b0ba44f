"""The Scheduler contract shared by the simulator and the PyTorch runtime.

A policy has two parts:

* a **static plan** (:class:`Plan`), built once from a :class:`~commsched.workload.Workload`
  and a :class:`NetworkEstimate`: the communication tasks (buckets, partitions,
  reduce-scatter/all-gather pairs), their priorities and dependencies, and
  *when* reduced gradients are applied (``update="step"``: all layers at
  ``optimizer.step()``, after every task finished, as PyTorch DDP does;
  ``update="forward"``: each layer just before its next forward, once the
  tasks carrying its gradients have finished, as DeAR and ByteScheduler's
  cross-barrier do);
* an **online state machine** (:class:`Scheduler`) that turns events into actions.

Events, delivered one at a time in the order the training process produces them:

``on_grad_ready(tensor)``
    the gradient of ``tensor`` (index into ``workload.tensors``) is final for
    this iteration. Delivered in autograd order; tensors that received no
    gradient are delivered (as zeros) in index order before ``on_backward_done``.
``on_backward_done()``
    backward has finished: every tensor has been reported ready.
``on_step()``
    ``optimizer.step()`` was called; the iteration ends here.
``on_forward_pre(layer)``
    ``layer`` (index into ``workload.layers``) is about to run its forward.
``on_flush()``
    the caller needs every update applied now (evaluation, checkpoint, end of
    training): the scheduler launches whatever it still owes.
``on_comm_done(task)``
    only for schedulers with ``uses_completions = True``: a task finished.

Actions:

``Launch(task)``
    issue the collective. Launches are issued **strictly in the order they are
    returned**; a launch whose inputs are not ready yet (gradients of its
    segments, or tasks in ``deps``) is held by the driver, and every later
    launch waits behind it. This is what makes the collective order identical
    on every rank.
``Wait(task)``
    stop processing events until ``task`` has finished (used for pacing, e.g.
    a credit window). It blocks the scheduler, never the compute.

Determinism: a scheduler's decisions must be a function of the event sequence
(and, for ``uses_completions`` schedulers, of completions as seen by rank 0,
whose decisions the runtime forwards to every other rank). Nothing may depend
on a local clock.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal

from commsched.errors import ScheduleError
from commsched.workload import Workload

TaskKind = Literal["all_reduce", "reduce_scatter", "all_gather"]
UpdateMode = Literal["step", "forward"]

#: Task kinds whose completion delivers the final, fully reduced gradient.
FINAL_KINDS: frozenset[str] = frozenset({"all_reduce", "all_gather"})


@dataclass(frozen=True, slots=True)
class Segment:
    """Elements ``[start, stop)`` of the flattened gradient of tensor ``tensor``."""

    tensor: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class CommTask:
    """One collective over the concatenation of ``segments`` (a bucket or partition).

    ``priority``: smaller is more urgent (0 = the layer nearest the input).
    ``deps``: ids of tasks that must have finished before this one starts
    (an all-gather depends on the reduce-scatter of the same group).
    """

    id: int
    kind: TaskKind
    segments: tuple[Segment, ...]
    bytes: int
    name: str
    priority: int = 0
    deps: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.segments)

    @property
    def tensors(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(s.tensor for s in self.segments))


@dataclass(frozen=True, slots=True)
class Launch:
    task: int


@dataclass(frozen=True, slots=True)
class Wait:
    task: int


Action = Launch | Wait


@dataclass(frozen=True, slots=True)
class NetworkEstimate:
    """What a policy may know about the network when it plans.

    The simulator derives it from the cluster spec; the runtime measures it.
    ``bandwidth_bytes_per_s`` is the per-worker bottleneck bandwidth,
    ``latency_s`` the per-message startup cost (alpha).
    """

    world_size: int
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ScheduleError(f"world_size must be >= 1, got {self.world_size}")
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ScheduleError(f"bandwidth_bytes_per_s must be > 0, got {self.bandwidth_bytes_per_s}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ScheduleError(f"latency_s must be >= 0, got {self.latency_s}")

    def allreduce_s(self, nbytes: float) -> float:
        """Ring all-reduce estimate: 2(p-1)·alpha + 2(p-1)/p · n / bandwidth."""
        p = self.world_size
        if p == 1:
            return 0.0
        return 2 * (p - 1) * self.latency_s + 2 * (p - 1) / p * nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Plan:
    """The static part of a policy: what is communicated, in which pieces, and when updates apply."""

    policy: str
    workload: Workload = field(repr=False)
    tasks: tuple[CommTask, ...]
    update: UpdateMode
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    # ---- derived maps ----

    @cached_property
    def final_tasks_of_tensor(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the tasks whose completion delivers its reduced gradient."""
        out: list[list[int]] = [[] for _ in self.workload.tensors]
        for task in self.tasks:
            if task.kind in FINAL_KINDS:
                for t in task.tensors:
                    out[t].append(task.id)
        return tuple(tuple(x) for x in out)

    @cached_property
    def final_tasks_of_layer(self) -> tuple[tuple[int, ...], ...]:
        """For each layer, the tasks that must finish before its update can be applied."""
        per_layer: list[dict[int, None]] = [{} for _ in self.workload.layers]
        for t, layer in enumerate(self.workload.tensor_layer):
            per_layer[layer].update(dict.fromkeys(self.final_tasks_of_tensor[t]))
        return tuple(tuple(d) for d in per_layer)

    @cached_property
    def tasks_reading_tensor(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the tasks that read its local gradient (need it ready before launch)."""
        out: list[list[int]] = [[] for _ in self.workload.tensors]
        for task in self.tasks:
            if task.kind != "all_gather":
                for t in task.tensors:
                    out[t].append(task.id)
        return tuple(tuple(x) for x in out)

    @property
    def total_bytes(self) -> int:
        """Gradient bytes moved per iteration (an RS+AG pair counts once, like one all-reduce)."""
        return sum(t.bytes for t in self.tasks if t.kind != "all_gather")

    # ---- validation ----

    def check(self) -> None:
        """Every gradient element is reduced exactly once and delivered exactly once."""
        w = self.workload
        for i, task in enumerate(self.tasks):
            if task.id != i:
                raise ScheduleError(f"{self.policy}: task at position {i} has id {task.id}")
            for d in task.deps:
                if not 0 <= d < len(self.tasks) or d == i:
                    raise ScheduleError(f"{self.policy}: task {i} has invalid dependency {d}")
            for s in task.segments:
                if not 0 <= s.tensor < len(w.tensors):
                    raise ScheduleError(f"{self.policy}: task {i} names unknown tensor {s.tensor}")
                if not 0 <= s.start < s.stop <= w.tensors[s.tensor].numel:
                    raise ScheduleError(f"{self.policy}: task {i} has segment {s} outside tensor bounds")
        for role, kinds in (("reduced", {"all_reduce", "reduce_scatter"}), ("delivered", FINAL_KINDS)):
            covered = [0] * len(w.tensors)
            for task in self.tasks:
                if task.kind in kinds:
                    for s in task.segments:
                        covered[s.tensor] += s.numel
            for t, n in enumerate(covered):
                if n != w.tensors[t].numel:
                    raise ScheduleError(
                        f"{self.policy}: tensor {w.tensors[t].name} has {n} of {w.tensors[t].numel} elements {role}"
                    )


class Scheduler(ABC):
    """Online part of a policy. Subclasses override the events they care about.

    A scheduler object lives for the whole training run; ``on_step`` marks the
    end of each iteration. Subclasses define ``name`` and ``build_plan``.
    """

    name: ClassVar[str]
    #: True when decisions depend on completion timing (then ``on_comm_done`` is delivered
    #: and, in the runtime, rank 0 decides for everyone).
    uses_completions: ClassVar[bool] = False

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        return ()

    def on_backward_done(self) -> Sequence[Action]:
        return ()

    def on_step(self) -> Sequence[Action]:
        return ()

    def on_forward_pre(self, layer: int) -> Sequence[Action]:
        return ()

    def on_flush(self) -> Sequence[Action]:
        return ()

    def on_comm_done(self, task: int) -> Sequence[Action]:
        return ()


def require_positive(policy: str, **knobs: float | None) -> None:
    """Raise ``ScheduleError`` naming the first knob that is not a number > 0 (``None`` means unset)."""
    for knob, value in knobs.items():
        if value is not None and not value > 0:
            raise ScheduleError(f"{policy}: {knob} must be > 0, got {value}")


class ReadyTracker:
    """Counts ready tensors per task so a policy knows when a task's inputs are complete."""

    __slots__ = ("_missing", "_readers")

    def __init__(self, plan: Plan, tasks: Iterable[int] | None = None) -> None:
        chosen = set(range(len(plan.tasks))) if tasks is None else set(tasks)
        self._readers = tuple(tuple(x for x in r if x in chosen) for r in plan.tasks_reading_tensor)
        self._missing = {i: len(plan.tasks[i].tensors) for i in chosen if plan.tasks[i].kind != "all_gather"}

    def mark(self, tensor: int) -> list[int]:
        """Record ``tensor`` ready; return the tasks whose inputs just became complete."""
        done = []
        for task in self._readers[tensor]:
            self._missing[task] -= 1
            if self._missing[task] == 0:
                done.append(task)
        return done

    def reset(self, plan: Plan) -> None:
        for task in self._missing:
            self._missing[task] = len(plan.tasks[task].tensors)
