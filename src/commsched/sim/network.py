"""The simulator's network: what it needs from one, and the flow-level model it uses today.

:class:`NetworkModel` is the contract. The simulator hands the network each
collective once every worker has issued it (:meth:`NetworkModel.ready`); the
network calls the completion callback it was built with when the collective
is done (never from inside ``ready``), with ``start_s`` and ``end_s`` set; and
it exposes ``links``, the resources whose busy time the simulator reports as
utilisation. A model is built by a :data:`NetworkFactory` from a
:class:`NetworkContext` (event loop, cluster, cost model, plan tasks,
``max_concurrent``, callback); :data:`NETWORK_MODELS` names the factories
``SimOptions.network`` selects from. A packet-level model registers there.

The flow-level model, :class:`Network`: a collective is *ready* once every participating worker has issued it. Ready
collectives start in the order they became ready, at most
``max_concurrent`` at a time (a communicator's stream: NCCL runs the
collectives of one communicator one after another, gloo runs a few at once
on its worker threads). Each phase first waits its startup latency (which
uses no bandwidth), then transfers ``work_s`` seconds' worth of data on its
resource. Transfers on one resource share it equally (processor sharing:
with ``n`` active transfers each progresses at rate ``1/n``). Every
collective spans all workers and loads every link of its resource alike, so
this equal share is also the max-min fair share of the flow-level model.
A collective never ends before ``start_s + floor_s`` (the simulator sets the
floor where the collective's CPU work, not the network, is the bound, or
where its workers' compute slows it: ``floor_at_start``, taken as it starts);
it holds its slot until then.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from commsched.cluster import Cluster
from commsched.schedule.base import CommTask
from commsched.sim.costs import CommModel, Phase
from commsched.sim.engine import COMM, EventLoop
from commsched.sim.packet.model import packet_network
from commsched.workload import Workload


class SharedLink:
    """One resource under processor sharing, tracked in virtual time.

    The virtual clock ``v`` is the work each active transfer has received; it
    advances at ``1/n`` per second with ``n`` active transfers, so a transfer
    of ``work_s`` that joined at ``v0`` ends when ``v`` reaches ``v0 + work_s``.
    Adding or removing a transfer costs O(log n).
    """

    __slots__ = ("_gen", "_heap", "_last_s", "_loop", "_seq", "_v", "busy", "name", "served_s")

    def __init__(self, loop: EventLoop, name: str) -> None:
        self._loop = loop
        self.name = name
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._v = 0.0
        self._last_s = 0.0
        self._gen = 0
        self._seq = 0
        #: Total transfer work served (seconds at full rate).
        self.served_s = 0.0
        #: Busy periods ``[start, end]`` (merged when contiguous).
        self.busy: list[list[float]] = []

    @property
    def active(self) -> int:
        return len(self._heap)

    def _advance(self) -> None:
        now = self._loop.now
        n = len(self._heap)
        if n:
            self._v += (now - self._last_s) / n
            self.served_s += now - self._last_s
        self._last_s = now

    def add(self, work_s: float, done: Callable[[], None]) -> None:
        """Start a transfer of ``work_s``; call ``done()`` when it has been served."""
        self._advance()
        now = self._loop.now
        if not self._heap:
            if self.busy and self.busy[-1][1] >= now:
                pass  # contiguous with the previous busy period
            else:
                self.busy.append([now, now])
        self._seq += 1
        heapq.heappush(self._heap, (self._v + work_s, self._seq, done))
        self._reschedule()

    def _reschedule(self) -> None:
        self._gen += 1
        if self._heap:
            finish = self._loop.now + (self._heap[0][0] - self._v) * len(self._heap)
            self._loop.schedule(finish, self._finish, self._gen, priority=COMM)

    def _finish(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later add or finish
        self._advance()
        heap = self._heap
        finished = [heapq.heappop(heap)[2]]  # the one this event was scheduled for, whatever rounding says
        tolerance = 1e-12 * max(1.0, abs(self._v))
        while heap and heap[0][0] <= self._v + tolerance:
            finished.append(heapq.heappop(heap)[2])
        if not heap:
            self.busy[-1][1] = self._loop.now
        self._reschedule()
        for done in finished:
            done()

    def busy_within(self, start_s: float, end_s: float) -> float:
        """Seconds in ``[start_s, end_s]`` during which at least one transfer was active."""
        total = 0.0
        for lo, hi in self.busy:
            total += max(0.0, min(hi, end_s) - max(lo, start_s))
        return total


@dataclass(slots=True)
class Collective:
    """One running instance of a plan task."""

    task: int
    instance: int
    phases: tuple[Phase, ...]
    ready_s: float
    start_s: float = -1.0
    end_s: float = -1.0
    phase: int = 0
    phase_starts: list[float] = field(default_factory=list)
    #: The least time it takes once started, whatever the network: its CPU work where that is the bound.
    floor_s: float = 0.0
    #: A floor that depends on when it starts (what its workers still compute then), taken as it starts.
    floor_at_start: Callable[[], float] | None = None

    def started(self, now: float) -> None:
        """It takes its slot at ``now``: its start, and its floor where that depends on the moment."""
        self.start_s = now
        if self.floor_at_start is not None:
            self.floor_s = max(self.floor_s, self.floor_at_start())


class LinkUsage(Protocol):
    """A link resource as the simulator's metrics see it."""

    def busy_within(self, start_s: float, end_s: float) -> float:
        """Seconds in ``[start_s, end_s]`` during which the resource carried data."""
        ...


class NetworkModel(Protocol):
    """What the simulator needs from a network model (module docstring)."""

    @property
    def links(self) -> Mapping[str, LinkUsage]:
        """Link resources by name, for ``SimResult.link_utilisation``."""
        ...

    def ready(self, coll: Collective) -> None:
        """Every participant has issued ``coll``: run it, and report it through the callback when done."""
        ...


@dataclass(frozen=True)
class NetworkContext:
    """Everything a network factory may use to build a model for one simulation.

    ``tasks``: the plan's tasks (a collective's ``task`` indexes them: kind,
    bytes, priority, transport). ``comm``: the α-β cost model, whose phases
    each collective carries. ``done``: call it with each finished collective.
    """

    loop: EventLoop
    cluster: Cluster
    comm: CommModel
    tasks: tuple[CommTask, ...]
    max_concurrent: int
    done: Callable[[Collective], None]
    #: The plan's workload (the packet model reads DLCP's per-layer gradient magnitudes from it).
    workload: Workload | None = None


#: Builds a network model for one simulation.
NetworkFactory = Callable[[NetworkContext], NetworkModel]


class Network:
    """The flow-level model: ready queue, concurrency limit and phase execution for all collectives of one job."""

    __slots__ = ("_done", "_loop", "_queue", "links", "max_concurrent", "running")

    def __init__(self, loop: EventLoop, max_concurrent: int, done: Callable[[Collective], None]) -> None:
        self._loop = loop
        self.max_concurrent = max_concurrent
        self._done = done
        self._queue: deque[Collective] = deque()
        self.running = 0
        self.links: dict[str, SharedLink] = {}

    def link(self, name: str) -> SharedLink:
        if name not in self.links:
            self.links[name] = SharedLink(self._loop, name)
        return self.links[name]

    def ready(self, coll: Collective) -> None:
        """Every participant has issued ``coll``: start it now or when a slot frees up."""
        self._queue.append(coll)
        self._start_queued()

    def _start_queued(self) -> None:
        while self._queue and self.running < self.max_concurrent:
            coll = self._queue.popleft()
            self.running += 1
            coll.started(self._loop.now)
            self._run_phase(coll)

    def _run_phase(self, coll: Collective) -> None:
        if coll.phase == len(coll.phases):
            floor_end = coll.start_s + coll.floor_s
            if floor_end > self._loop.now:  # CPU-bound: done when its CPU work is
                self._loop.schedule(floor_end, self._complete, coll, priority=COMM)
            elif coll.phases:
                self._complete(coll)
            else:  # free collective (one worker): complete through the loop, never re-entrantly
                self._loop.schedule(self._loop.now, self._complete, coll, priority=COMM)
            return
        coll.phase_starts.append(self._loop.now)
        phase = coll.phases[coll.phase]
        if phase.latency_s > 0:
            self._loop.schedule(self._loop.now + phase.latency_s, self._transfer, coll, priority=COMM)
        else:
            self._transfer(coll)

    def _transfer(self, coll: Collective) -> None:
        phase = coll.phases[coll.phase]
        if phase.work_s > 0:
            self.link(phase.resource).add(phase.work_s, lambda: self._next_phase(coll))
        else:  # through the loop, so a completion never happens inside ready()
            self._loop.schedule(self._loop.now, self._next_phase, coll, priority=COMM)

    def _next_phase(self, coll: Collective) -> None:
        coll.phase += 1
        self._run_phase(coll)

    def _complete(self, coll: Collective) -> None:
        coll.end_s = self._loop.now
        self.running -= 1
        self._start_queued()
        self._done(coll)


def flow_network(context: NetworkContext) -> Network:
    """The flow-level model (:class:`Network`): α-β phases, processor sharing on each link resource."""
    return Network(context.loop, context.max_concurrent, context.done)


#: Network models by the name ``SimOptions.network`` accepts.
NETWORK_MODELS: dict[str, NetworkFactory] = {"flow": flow_network, "packet": packet_network}
