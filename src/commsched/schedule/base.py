"""The Scheduler contract shared by the simulator and the PyTorch runtime.

A policy has two parts:

* a **static plan** (:class:`~commsched.schedule.plan.CommPlan`), built once
  from a :class:`~commsched.workload.Workload` and a :class:`NetworkEstimate`:
  the communication tasks (buckets, partitions, reduce-scatter/all-gather
  pairs, parameter-server push/pull pairs), their priorities, dependencies,
  transport and loss bound, and *when* reduced gradients are applied
  (``update="step"``: all layers at ``optimizer.step()``, after every task
  finished, as PyTorch DDP does; ``update="forward"``: each layer just before
  its next forward, once the tasks carrying its gradients have finished, as
  DeAR and ByteScheduler's cross-barrier do);
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
    start the task. Launches are started **strictly in the order they are
    returned**; a launch whose inputs are not ready yet (gradients of its
    segments, or tasks in ``deps``) is held, and every later launch waits
    behind it. This is what makes the collective order identical on every rank.
``Wait(task)``
    stop processing events until ``task`` has finished (used for pacing, e.g.
    a credit window). It blocks the scheduler, never the compute.

The contract is interpreted in one place, :class:`commsched.schedule.dispatch.Dispatcher`,
which both drivers (simulator and runtime) use.

Determinism: a scheduler's decisions must be a function of the event sequence
(and, for ``uses_completions`` schedulers, of completions as seen by rank 0,
whose decisions every other rank follows). Nothing may depend on a local clock.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from commsched.errors import ScheduleError
from commsched.formulas import ring_all_reduce_s
from commsched.schedule.knobs import Knobs, NoKnobs

if TYPE_CHECKING:
    from commsched.schedule.plan import CommPlan
    from commsched.workload import Workload

#: ``push`` sends local gradients to the servers that own them (they sum), ``pull`` fetches the sums:
#: a parameter server's pair, as ``reduce_scatter``/``all_gather`` is a collective's.
TaskKind = Literal["all_reduce", "reduce_scatter", "all_gather", "push", "pull"]
TASK_KINDS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "push", "pull")
UpdateMode = Literal["step", "forward"]

#: Task kinds that read this rank's local gradients (their inputs must be ready before they start).
READING_KINDS: frozenset[str] = frozenset({"all_reduce", "reduce_scatter", "push"})
#: Task kinds that reduce gradients over ranks (each element exactly once).
REDUCING_KINDS: frozenset[str] = frozenset({"all_reduce", "reduce_scatter", "push"})
#: Task kinds whose completion delivers the final, fully reduced gradient (each element exactly once).
FINAL_KINDS: frozenset[str] = frozenset({"all_reduce", "all_gather", "pull"})

#: The transport every lossless policy uses: gloo/NCCL collectives.
COLLECTIVE = "collective"
#: The parameter-server transport: push/pull through servers (the runtime's: a server on every rank,
#: :mod:`commsched.transport.ps`; the simulator's: the cluster's servers, else one on every worker).
PS_TRANSPORT = "ps"


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
    (an all-gather depends on the reduce-scatter of the same group, a pull
    on its push).
    ``transport``: which transport moves the bytes (``"collective"``: gloo or
    NCCL; a parameter-server or bounded-loss transport registers its own name).
    ``loss_bound``: the largest fraction of this task's gradient bytes the
    transport may give up on (0 = lossless: every byte arrives).
    """

    id: int
    kind: TaskKind
    segments: tuple[Segment, ...]
    bytes: int
    name: str
    priority: int = 0
    deps: tuple[int, ...] = ()
    transport: str = COLLECTIVE
    loss_bound: float = 0.0

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
    ``cpu_per_message_s`` and ``cpu_s_per_byte``: the host CPU time one
    message costs (the collective's threads, the kernel's TCP), which a host
    that computes on the same cores loses from compute; 0 where communication
    runs beside compute (a GPU's copy engines). The runtime measures them in
    its warm-up; ``policy="auto"`` simulates with them. ``transport_cpu``:
    ``(transport, seconds per task, seconds per byte)`` entries for a
    transport whose tasks cost other CPU work than those (the ``"ps"``
    transport's push and pull), where it was measured apart.
    """

    world_size: int
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    cpu_per_message_s: float = 0.0
    cpu_s_per_byte: float = 0.0
    transport_cpu: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ScheduleError(f"world_size must be >= 1, got {self.world_size}")
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ScheduleError(f"bandwidth_bytes_per_s must be > 0, got {self.bandwidth_bytes_per_s}")
        for name in ("latency_s", "cpu_per_message_s", "cpu_s_per_byte"):
            value = getattr(self, name)
            finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if not (finite and value >= 0):
                raise ScheduleError(f"{name} must be a finite number >= 0, got {value!r}")
        entries = transport_cpu_entries(self.transport_cpu)
        if entries is None:
            raise ScheduleError(
                f"transport_cpu must be (transport, seconds per task >= 0, seconds per byte >= 0) entries, "
                f"got {self.transport_cpu!r}"
            )
        object.__setattr__(self, "transport_cpu", entries)

    def allreduce_s(self, nbytes: float) -> float:
        """Ring all-reduce estimate (:func:`commsched.formulas.ring_all_reduce_s`)."""
        return ring_all_reduce_s(nbytes, self.world_size, self.latency_s, self.bandwidth_bytes_per_s)

    def to_dict(self) -> dict[str, float | int | list[list[str | float]]]:
        """The fields; the CPU costs only where measured (plans made from a cluster spec stay as before)."""
        out: dict[str, float | int | list[list[str | float]]] = {
            "world_size": self.world_size,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
        }
        if self.cpu_per_message_s or self.cpu_s_per_byte:
            out["cpu_per_message_s"] = self.cpu_per_message_s
            out["cpu_s_per_byte"] = self.cpu_s_per_byte
        if self.transport_cpu:
            out["transport_cpu"] = [list(entry) for entry in self.transport_cpu]
        return out


def transport_cpu_entries(value: object) -> tuple[tuple[str, float, float], ...] | None:
    """``value`` as ``(transport, a, b)`` entries, each a name and two finite numbers >= 0, as hashable tuples
    (JSON gives lists of lists); None where it is not that. :class:`NetworkEstimate` (seconds) and
    :class:`~commsched.sim.SimOptions` (milliseconds) check their ``transport_cpu`` with it."""
    if not isinstance(value, list | tuple):
        return None
    entries = tuple(tuple(e) if isinstance(e, list | tuple) else e for e in value)
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], str)):
            return None
        numbers = [v for v in entry[1:] if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) != 2 or not all(math.isfinite(v) and v >= 0 for v in numbers):
            return None
    return entries


class Scheduler(ABC):
    """Online part of a policy. Subclasses override the events they care about.

    A scheduler object lives for the whole training run; ``on_step`` marks the
    end of each iteration. Subclasses define ``name``, ``knob_type`` (a
    :class:`~commsched.schedule.knobs.Knobs` dataclass) and
    ``build_plan(workload, network, knobs) -> CommPlan``.
    """

    name: ClassVar[str]
    knob_type: ClassVar[type[Knobs]] = NoKnobs
    #: True when decisions depend on completion timing (then ``on_comm_done`` is delivered
    #: and one rank decides for everyone).
    uses_completions: ClassVar[bool] = False
    #: False for policies that may give up on part of a gradient (a bounded loss).
    lossless: ClassVar[bool] = True
    #: When the policy's plans apply updates (every plan it builds says the same): known before any plan
    #: exists, so a runtime can refuse what a deferred update cannot support (GradScaler) at once.
    update_mode: ClassVar[UpdateMode] = "step"

    def __init__(self, plan: CommPlan) -> None:
        self.plan = plan

    @classmethod
    def decides_on_completions(cls, plan: CommPlan) -> bool:
        """Whether ``plan``'s decisions can depend on completion timing: then ``on_comm_done`` is delivered and
        one rank decides for everyone; else every rank decides on its own events. ``uses_completions`` unless a
        policy knows that ``plan``'s completions cannot change a decision."""
        return cls.uses_completions

    @classmethod
    def transports(cls, knobs: Knobs) -> frozenset[str]:
        """The transports this policy's plans use under ``knobs`` (the runtime checks them at ``parallelize()``)."""
        return frozenset({COLLECTIVE})

    @classmethod
    def plans_with_cpu_of(cls, knobs: Knobs) -> frozenset[str]:
        """The transports whose CPU work per task, timed apart in the warm-up (``NetworkEstimate.transport_cpu``),
        this policy's plan under ``knobs`` is made with (none by default)."""
        return frozenset()

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        raise NotImplementedError

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


class ReadyTracker:
    """Counts ready tensors per task so a policy knows when a task's inputs are complete."""

    __slots__ = ("_missing", "_readers")

    def __init__(self, plan: CommPlan, tasks: Iterable[int] | None = None) -> None:
        chosen = set(range(len(plan.tasks))) if tasks is None else set(tasks)
        self._readers = tuple(tuple(x for x in r if x in chosen) for r in plan.tasks_reading_tensor)
        self._missing = {i: len(plan.tasks[i].tensors) for i in chosen if plan.tasks[i].kind in READING_KINDS}

    def mark(self, tensor: int) -> list[int]:
        """Record ``tensor`` ready; return the tasks whose inputs just became complete."""
        done = []
        for task in self._readers[tensor]:
            self._missing[task] -= 1
            if self._missing[task] == 0:
                done.append(task)
        return done

    def reset(self, plan: CommPlan) -> None:
        for task in self._missing:
            self._missing[task] = len(plan.tasks[task].tensors)


class BucketsInOrder(Scheduler):
    """The online part shared by bucketed all-reduce policies (DDP, MG-WFBP): a bucket is launched once
    all its gradients are ready, and buckets in index order (a full bucket waits for the ones before it)."""

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        self._tracker = ReadyTracker(plan)
        self._full = [False] * len(plan.tasks)
        self._next = 0

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        for task in self._tracker.mark(tensor):
            self._full[task] = True
        out: list[Action] = []
        while self._next < len(self._full) and self._full[self._next]:
            out.append(Launch(self._next))
            self._next += 1
        return out

    def on_backward_done(self) -> Sequence[Action]:
        if self._next != len(self._full):
            raise ScheduleError(f"{self.name}: backward done but bucket {self._next} never filled")
        return ()

    def on_step(self) -> Sequence[Action]:
        self._tracker.reset(self.plan)
        self._full = [False] * len(self.plan.tasks)
        self._next = 0
        return ()
