"""Loss records: what a bounded-loss transport gave up, per tensor and iteration, and where it was lost.

A transport that may finish a transfer short of every element
(:class:`~commsched.transport.bounded.LossReporting`: the ``"dlcp"`` and
``"dlcp_ps"`` transports) reports each launch's lost elements; this module
turns them into one :class:`StepLoss` per training iteration on this rank:

* ``transfers``: per task and phase (``"push"``: the reduce phase, where this
  rank sums its shard from every peer; ``"pull"``: the gather phase, where it
  receives the other owners' sums), the elements this rank received, how
  many of them it gave up (exact, from the receives), per tensor the task
  carries, and the bound each receive had. A lost push element is a peer's
  contribution counted as zero; a lost pull element keeps the previous sum.
* ``drops``: the data datagrams lost on the way during the iteration's
  window, by where: ``injected`` (the link's emulated loss, this rank's
  sends), ``late`` (arrived after their receive had ended: the application
  stopped waiting for them), ``send_errors`` (this rank's socket refused
  them), ``socket`` (the kernel dropped them at this rank's DLCP sockets, a
  full receive buffer), ``rcvbuf`` (the namespace's UDP receive-buffer
  errors, ``/proc/net/snmp``: every UDP socket of the namespace, so on a host
  whose ranks share one namespace, all of theirs) and ``qdisc`` (from the
  ``qdisc_drops`` source a testbed gives, e.g. the drops of its switch
  ports; None without one). Elements are lost only at the application,
  which stops waiting at the bound (count-based early completion); these
  counters say where the datagrams it did not wait for went. A receive that
  reaches its deadline with more than its bound missing is not recorded: it
  fails the step with :class:`~commsched.errors.RuntimeCommError`.

**Windows.** Iteration ``s``'s record is completed at the ``optimizer.step()``
of iteration ``s + 1`` (by then every transfer of ``s`` has finished: a
deferred update waits for its pulls before the layer's next forward), and its
``drops`` are the counters' change from the ``step()`` of ``s`` to that of
``s + 1``: the window in which a deferred-update plan runs the pulls of ``s``
and the pushes of ``s + 1`` (when several records complete at once, the
window's drops go to the last). ``ParallelModule.loss_records()`` first
flushes, so the last iteration's record is there too (its window ends at the
flush).

Each record with a loss also becomes a trace event (``kind="loss"``, the
task's name, ``bytes`` lost, at the ``step()`` that collected it) when the
model was parallelized with ``trace=True``. The latest ``keep`` records are
kept (10,000 iterations); :attr:`LossLog.worst` keeps the largest lost
fraction of any push and of any pull over the whole run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from commsched.schedule import CommPlan
from commsched.trace import Trace, TraceEvent
from commsched.transport import Transport
from commsched.transport.bounded import DropCounters, LossReporting
from commsched.transport.dlcp.kernel import udp_rcvbuf_errors
from commsched.transport.exchange import PUSH, Loss

#: Iterations of records kept.
KEEP_ITERATIONS = 10_000


@dataclass(frozen=True, slots=True)
class TransferLoss:
    """One phase of one task in one iteration, on this rank: ``lost_numel`` of ``received_numel`` given up.

    ``tensors``: the names of the tensors the task carries, and
    ``lost_by_tensor`` the lost elements of each; ``loss_bound``: the bound of
    each of the phase's receives (so ``fraction <= loss_bound`` always).
    """

    task: str
    phase: str
    tensors: tuple[str, ...]
    lost_by_tensor: tuple[int, ...]
    lost_numel: int
    received_numel: int
    loss_bound: float

    @property
    def fraction(self) -> float:
        return self.lost_numel / self.received_numel if self.received_numel else 0.0


@dataclass(frozen=True, slots=True)
class Drops:
    """Data datagrams lost on the way in one window on this rank, by where (None: no such counter here)."""

    injected: int = 0
    late: int = 0
    send_errors: int = 0
    socket: int | None = None
    rcvbuf: int | None = None
    qdisc: int | None = None


@dataclass(frozen=True, slots=True)
class StepLoss:
    """What this rank gave up in training iteration ``iteration`` (0 = the first ``optimizer.step()``)."""

    iteration: int
    transfers: tuple[TransferLoss, ...]
    drops: Drops

    def lost(self, phase: str) -> int:
        """Elements given up in ``phase`` (``"push"`` or ``"pull"``), over every task."""
        return sum(t.lost_numel for t in self.transfers if t.phase == phase)

    def by_tensor(self) -> dict[tuple[str, str], int]:
        """Per ``(tensor name, phase)``: elements given up."""
        out: dict[tuple[str, str], int] = {}
        for t in self.transfers:
            for name, lost in zip(t.tensors, t.lost_by_tensor, strict=True):
                out[(name, t.phase)] = out.get((name, t.phase), 0) + lost
        return out


@dataclass
class _Counters:
    """Cumulative counter readings at one moment."""

    link: DropCounters = field(default_factory=DropCounters)
    rcvbuf: int | None = None
    qdisc: int | None = None


def _less(now: int | None, before: int | None) -> int | None:
    return None if now is None or before is None else now - before


class LossLog:
    """This rank's loss records (module docstring); fed by the engine at every plan and every ``step()``."""

    def __init__(self, rank: int, trace: Trace | None, t0: float, qdisc_drops: Callable[[], int] | None = None) -> None:
        self.rank = rank
        self._trace = trace
        self._t0 = t0
        self._qdisc_drops = qdisc_drops
        self._plan: CommPlan | None = None
        self._bytes_per_element: dict[str, float] = {}
        self._first_iteration = 0
        self._sources: dict[str, LossReporting] = {}
        self._offsets: dict[str, dict[int, int]] = {}  # per transport: launches of each task before this plan
        self._open: dict[int, list[TransferLoss]] = {}  # iteration -> transfers so far
        self._counters: _Counters | None = None
        self.records: deque[StepLoss] = deque(maxlen=KEEP_ITERATIONS)
        #: the largest lost fraction of any push and of any pull so far, and the bound it had
        self.worst: dict[str, tuple[float, float]] = {"push": (0.0, 0.0), "pull": (0.0, 0.0)}

    @property
    def active(self) -> bool:
        """Whether any transport in use can lose (nothing is recorded, or read, otherwise)."""
        return bool(self._sources)

    def plan_adopted(self, plan: CommPlan, first_iteration: int, transports: Mapping[str, Transport]) -> None:
        """``plan`` runs from training iteration ``first_iteration`` on (its tasks' instance 0)."""
        self._collect()  # what the previous plan's transfers reported belongs to its tasks
        used = {t.transport for t in plan.tasks}
        self._sources = {n: t for n, t in transports.items() if n in used and isinstance(t, LossReporting)}
        self._offsets = {n: src.launches() for n, src in self._sources.items()}
        self._plan = plan
        self._bytes_per_element = {t.name: t.bytes / t.numel for t in plan.tasks if t.numel}
        self._first_iteration = first_iteration
        if self._sources and self._counters is None:
            self._counters = self._read()

    def after_step(self, iterations: int) -> None:
        """At ``optimizer.step()``, ``iterations`` steps taken: complete the record of the iteration before."""
        if self._sources:
            self._collect()
            self._close(iterations - 2)

    def finish(self, iterations: int) -> None:
        """Everything has been flushed: complete every record up to the last iteration."""
        if self._sources:
            self._collect()
            self._close(iterations - 1)

    # ---- internals ----

    def _read(self) -> _Counters:
        link = DropCounters()
        for src in self._sources.values():
            c = src.drop_counters()
            link = DropCounters(
                link.injected + c.injected, link.late + c.late, link.send_errors + c.send_errors,
                None if c.socket is None else (link.socket or 0) + c.socket,
            )  # fmt: skip
        return _Counters(link, udp_rcvbuf_errors(), self._qdisc_drops() if self._qdisc_drops is not None else None)

    def _collect(self) -> None:
        plan = self._plan
        if plan is None:
            return
        for name, src in self._sources.items():
            offsets = self._offsets[name]
            for loss in src.take_losses():
                if not 0 <= loss.task < len(plan.tasks):
                    continue
                iteration = self._first_iteration + loss.step - offsets.get(loss.task, 0)
                self._open.setdefault(iteration, []).append(self._transfer(plan, loss))

    @staticmethod
    def _transfer(plan: CommPlan, loss: Loss) -> TransferLoss:
        task = plan.tasks[loss.task]
        names = [plan.workload.tensors[seg.tensor].name for seg in task.segments]
        lost = [0] * len(task.segments)
        start = 0
        for i, seg in enumerate(task.segments):
            stop = start + seg.numel
            lost[i] = sum(max(0, min(b, stop) - max(a, start)) for a, b in loss.missing)
            start = stop
        tensors = tuple(dict.fromkeys(names))
        by_tensor = tuple(sum(n for nm, n in zip(names, lost, strict=True) if nm == t) for t in tensors)
        phase = "push" if loss.phase == PUSH else "pull"
        return TransferLoss(task.name, phase, tensors, by_tensor, loss.lost_numel, loss.received_numel, loss.loss_bound)

    def _close(self, upto: int) -> None:
        """Make the records of every open iteration ``<= upto``; the drops since the last record go to them."""
        due = sorted(i for i in self._open if i <= upto)
        if not due:
            return
        now, before = self._read(), self._counters or _Counters()
        self._counters = now
        drops = Drops(
            now.link.injected - before.link.injected,
            now.link.late - before.link.late,
            now.link.send_errors - before.link.send_errors,
            _less(now.link.socket, before.link.socket),
            _less(now.rcvbuf, before.rcvbuf),
            _less(now.qdisc, before.qdisc),
        )
        t_s = time.perf_counter() - self._t0
        for i in due:
            transfers = tuple(self._open.pop(i))
            self.records.append(StepLoss(i, transfers, drops if i == due[-1] else Drops()))
            for t in transfers:
                if t.fraction > self.worst[t.phase][0]:
                    self.worst[t.phase] = (t.fraction, t.loss_bound)
                if self._trace is not None and t.lost_numel:
                    lost_bytes = round(t.lost_numel * self._bytes_per_element.get(t.task, 0.0))
                    self._trace.add(TraceEvent(t.task, "loss", self.rank, t_s, t_s, lost_bytes, i))
