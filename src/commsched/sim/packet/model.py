"""The packet-level network model: collectives as the traffic of their algorithm, on a packet fabric.

:class:`PacketNetwork` implements the simulator's ``NetworkModel`` contract
(:mod:`commsched.sim.network`) and replaces only the cost of transfers: the
simulator still runs the policy through its dispatcher and hands the network
each collective once every worker has issued it. Ready collectives start in
ready order, at most ``max_concurrent`` at a time, as in the flow model.

A collective becomes the traffic of its algorithm (``SimOptions.algorithm``):

* ``ring`` (also used for ``tree`` and ``hierarchical``, which the packet
  model does not distinguish yet): rank ``i`` sends ``⌈n/p⌉`` bytes to rank
  ``i+1`` in each of ``p-1`` steps (reduce-scatter, all-gather) or
  ``2(p-1)`` steps (all-reduce); a rank sends step ``k`` once it has
  received step ``k-1`` from its predecessor.
* ``ps`` (and any task on the ``"ps"`` transport, whatever the algorithm): a
  push is every worker sending ``⌈n/k⌉`` bytes to each of the ``k`` servers;
  a pull every server sending ``⌈n/k⌉`` to every worker; an all-reduce is a
  push, then each server's pull once it has every push. A cluster that lists
  no servers has one on every worker (its own slice stays on the host).

* ``dlcp`` and ``dlcp_ps`` (tasks the plan puts on DLCP, whatever the
  algorithm): the slices the real exchange moves
  (:func:`~commsched.transport.slices.owner_slices`: a shard on every rank,
  or rank 0 the one server), each a DLCP message with the task's loss bound
  (a pull's own bound; an all-reduce's pull reliable), its layer class, and
  per-packet magnitudes from the workload's histograms
  (:mod:`~commsched.sim.packet.magnitudes`): rank ``r`` sends slice ``q`` to
  owner ``q`` (push), owner ``q`` sends its slice to every rank (pull).
  DLCP messages go over one connection per host pair, whatever the class:
  the class of each packet is its own (importance and layer).

With ``background_load > 0``, flows from ``background`` (a published
flow-size distribution, :mod:`~commsched.sim.packet.background`) arrive
between all hosts over ``[0, background_duration_s)``, in the last band, on
``transport``; their completion times are in :attr:`PacketNetwork.background_fcts`.

Each message waits its host's per-message overhead, then goes over a
persistent connection ``(src, dst, traffic class)`` of the configured
transport, so congestion windows carry over from one step to the next (as
NCCL's and gloo's long-lived sockets). A task's priority picks its traffic
class: priorities ``0..P`` are spread evenly over ``priority_classes``.

Time: the fabric keeps its own event heap. The model asks the simulator's
loop to wake it at the fabric's next event and then runs fabric events up to
the loop's next event of its own, so the two clocks never disagree and most
packet events never touch the simulator's heap.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commsched.errors import ScheduleError
from commsched.schedule.base import PS_TRANSPORT
from commsched.schedule.dlcp import DLCP_PS_TRANSPORT, DLCP_TRANSPORT
from commsched.sim.engine import COMM
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.connection import Connection
from commsched.sim.packet.extra import ExtraTraffic
from commsched.sim.packet.port import Port
from commsched.sim.packet.registry import TRANSPORTS
from commsched.sim.packet.scenario import Flow
from commsched.sim.packet.topology import build

if TYPE_CHECKING:
    from commsched.sim.network import Collective, NetworkContext
    from commsched.trace import Trace


class PacketNetwork(ExtraTraffic):
    """The packet-level model of one simulation (module docstring)."""

    def __init__(self, context: NetworkContext, config: PacketConfig | None = None) -> None:
        self.config = config or PacketConfig()
        if self.config.transport not in TRANSPORTS:
            known = ", ".join(TRANSPORTS)
            raise ScheduleError(f"packet: unknown transport {self.config.transport!r}; known: {known}")
        self._transport = TRANSPORTS[self.config.transport]
        self._loop = context.loop
        self._done = context.done
        self._tasks = context.tasks
        self._algorithm = context.comm.algorithm
        self.max_concurrent = context.max_concurrent
        built = build(context.cluster, self.config)
        self._built = built
        self.fabric = built.fabric
        self.workers = built.workers
        self.servers = built.servers
        top = max((t.priority for t in self._tasks), default=0)
        classes = self.config.priority_classes
        if self.config.background_load > 0 and classes > 1:
            classes -= 1  # the last band is the background's (and DLCP's best effort): the job keeps to the others
        self._class_of = [min(t.priority * classes // (top + 1), classes - 1) for t in self._tasks]
        self.connections: dict[tuple[int, int, int], Connection] = {}
        self._queue: deque[Collective] = deque()
        self.running = 0
        self._finished: list[Collective] = []
        self._wake_at = math.inf
        self._gen = 0
        self._workload = context.workload
        self._launches = [0] * len(self._tasks)
        self.dlcp_connections: dict[tuple[int, int], Connection] = {}
        #: ``(flow, completion time s)`` of every background flow that finished.
        self.background_fcts: list[tuple[Flow, float]] = []
        #: ``(launch, bytes, completion time s)`` of every message of a collective between two hosts, from its
        #: posting (before the per-message overhead) to its arrival; ``launch``: the task's launch it belongs to
        #: (the n-th launch of a task belongs to iteration n, warm-up included).
        self.message_fcts: list[tuple[int, int, float]] = []
        self._start_background()

    @property
    def links(self) -> Mapping[str, Port]:
        """Every output port by name (``w0>up``: rank 0's NIC; ``w1<down``: the switch port facing rank 1;
        on a multi-device node ``gpu1>up`` its NIC, ``w4>intra``/``w4<intra`` rank 4's intra-node link)."""
        return self.fabric.ports

    # ---- the simulator's side ----

    def ready(self, coll: Collective) -> None:
        """Every participant has issued ``coll``: start it now or when a slot frees up."""
        self._queue.append(coll)
        self._start_queued()
        self._sync()

    def _start_queued(self) -> None:
        fabric = self.fabric
        if fabric.now < self._loop.now:
            fabric.now = self._loop.now  # nothing is pending in the fabric before the loop's clock
        while self._queue and self.running < self.max_concurrent:
            coll = self._queue.popleft()
            self.running += 1
            coll.started(self._loop.now)
            self._launch(coll)

    def _sync(self) -> None:
        """Make sure the loop wakes the fabric at its next event (background flows alone do not keep a finished
        simulation going)."""
        t = self.fabric.peek()
        if not self.running and not self._queue and self._loop.peek() == math.inf:
            return
        if t < self._wake_at:
            self._wake_at = t
            self._gen += 1
            self._loop.schedule(max(t, self._loop.now), self._wake, self._gen, priority=COMM)

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._wake_at = math.inf
        finished = self._finished
        self.fabric.run(self._loop.peek(), lambda: bool(finished))
        for coll in finished:
            coll.end_s = max(self.fabric.now, coll.start_s + coll.floor_s)
            self._loop.schedule(coll.end_s, self._complete, coll, priority=COMM)
        finished.clear()
        self._sync()

    def _complete(self, coll: Collective) -> None:
        self.running -= 1
        self._start_queued()
        self._done(coll)
        self._sync()

    # ---- traffic ----

    def connection(self, src: int, dst: int, cls: int) -> Connection:
        key = (src, dst, cls)
        conn = self.connections.get(key)
        if conn is None:
            sender, receiver = self._transport(self.config, cls)
            conn = Connection(self.fabric, src, dst, cls, sender, receiver, self.fabric.rng.getrandbits(32))
            self.connections[key] = conn
        return conn

    def _message(self, src: int, dst: int, cls: int, nbytes: int, done: Callable[[], None], launch: int) -> None:
        """Send ``nbytes`` to ``dst`` after the overhead of the link leaving ``src``'s node; ``done()`` on arrival."""
        fabric = self.fabric
        if src == dst:  # a colocated server talking to its own host
            fabric.schedule(fabric.now, lambda _: done(), None)
            return
        done = self._timed(launch, nbytes, done)
        conn = self.connection(src, dst, cls)
        overhead = self._built.message_overhead_s(src, dst)
        if overhead > 0:
            fabric.schedule(fabric.now + overhead, lambda _: conn.message(nbytes, done), None)
        else:
            conn.message(nbytes, done)

    def _launch(self, coll: Collective) -> None:
        task = self._tasks[coll.task]
        cls = self._class_of[coll.task]
        p = len(self.workers)
        finished = self._finished
        launch = self._launches[coll.task]  # the n-th launch of a task belongs to iteration n
        self._launches[coll.task] += 1
        if p <= 1 or task.bytes <= 0 or not coll.phases:
            self.fabric.schedule(self.fabric.now, lambda _: finished.append(coll), None)
            return
        if task.transport in (DLCP_TRANSPORT, DLCP_PS_TRANSPORT):
            self._dlcp(coll, task, launch)
        elif self._algorithm == "ps" or task.transport == PS_TRANSPORT:
            self._ps(coll, task.kind, task.bytes, cls, launch)
        else:
            self._ring(coll, task.kind, task.bytes, cls, launch)

    def _ring(self, coll: Collective, kind: str, nbytes: int, cls: int, launch: int) -> None:
        hosts = self.workers
        p = len(hosts)
        steps = 2 * (p - 1) if kind == "all_reduce" else p - 1
        chunk = -(-nbytes // p)
        left = [p * steps]
        finished = self._finished

        def send(i: int, step: int) -> None:
            j = (i + 1) % p
            self._message(hosts[i], hosts[j], cls, chunk, lambda: received(j, step), launch)

        def received(j: int, step: int) -> None:
            left[0] -= 1
            if step + 1 < steps:
                send(j, step + 1)
            elif left[0] == 0:
                finished.append(coll)

        for i in range(p):
            send(i, 0)

    def _ps(self, coll: Collective, kind: str, nbytes: int, cls: int, launch: int) -> None:
        workers, servers = self.workers, self.servers or self.workers
        part = -(-nbytes // len(servers))
        push = kind in ("push", "reduce_scatter", "all_reduce")
        pull = kind in ("pull", "all_gather", "all_reduce")
        finished = self._finished
        left = [len(servers) * len(workers) * (int(push) + int(pull))]

        def arrived() -> None:
            left[0] -= 1
            if left[0] == 0:
                finished.append(coll)

        def pull_from(s: int) -> None:
            for w in workers:
                self._message(s, w, cls, part, arrived, launch)

        for s in servers:
            if not push:
                pull_from(s)
                continue
            pending = [len(workers)]

            def pushed(s: int = s, pending: list[int] = pending) -> None:
                arrived()
                pending[0] -= 1
                if pending[0] == 0 and pull:
                    pull_from(s)

            for w in workers:
                self._message(w, s, cls, part, pushed, launch)

    # ---- outputs (all transports) ----

    def flow_stats(self) -> list[dict[str, Any]]:
        """Per connection: drops and ECN marks of its packets; retransmissions, timeouts and fast recoveries
        of its sender."""
        out = []
        for conn in [*self.connections.values(), *self.dlcp_connections.values()]:
            sender = conn.sender
            out.append(
                {
                    "connection": conn.name,
                    "drops": conn.drops,
                    "marks": conn.marks,
                    "retransmits": getattr(sender, "retransmits", 0),
                    "timeouts": getattr(sender, "timeouts", 0),
                    "recoveries": getattr(sender, "recoveries", 0),
                }
            )
        return out

    def chrome_counters(self) -> list[dict[str, Any]]:
        """Queue depth of every port that queued anything, as Chrome counter events (``"ph": "C"``).

        Needs ``PacketConfig(record_queues=True)``. They go in a process of
        their own, ``network``, one counter track per port.
        """
        out: list[dict[str, Any]] = []
        for name, port in self.fabric.ports.items():
            if not port.samples:
                continue
            for time_s, queued in port.samples:
                out.append(
                    {
                        "name": f"queue {name}",
                        "ph": "C",
                        "pid": "network",
                        "ts": time_s * 1e6,
                        "args": {"bytes": queued},
                    }
                )
        return out

    def save_chrome(self, trace: Trace, path: str | Path) -> None:
        """``trace``'s Chrome JSON plus the queue-depth counter tracks and the per-connection stats.

        The counters live in this model's output rather than in the Trace
        schema, which keeps one interval per event; the file still loads
        back with ``Trace.load``.
        """
        data = trace.to_chrome()
        data["traceEvents"].extend(self.chrome_counters())
        data["packet"] = {"connections": self.flow_stats()}
        Path(path).write_text(json.dumps(data) + "\n")


def packet_factory(config: PacketConfig) -> Callable[[NetworkContext], PacketNetwork]:
    """A network factory for ``Simulation(..., network=...)`` with a non-default :class:`PacketConfig`."""
    return lambda context: PacketNetwork(context, config)


def packet_network(context: NetworkContext) -> PacketNetwork:
    """The packet-level model with the default :class:`PacketConfig` (``SimOptions(network="packet")``)."""
    return PacketNetwork(context)
