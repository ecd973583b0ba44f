"""The packet-level network core: hosts, switches, output ports, and its own event loop.

A packet travels a precomputed route: a tuple of output :class:`Port` objects,
the first the sending host's NIC, the last the switch port facing the
receiver. At each port it is queued (or dropped, or ECN-marked), serialised at
the port's rate (``wire bytes / rate``) and arrives at the next hop one
propagation delay later. So a packet alone on an idle path of ``h`` ports
arrives ``Σ (size / rate_h + prop_h)`` after it was sent (store and forward).

How one port queues, marks, drops and serialises is in
:mod:`commsched.sim.packet.port`; this module holds the packet, the hosts,
the routes and the clock.

The event loop runs ``(time, sequence, callback, argument)`` events in
``(time, sequence)`` order: a packet arriving at its next hop, a port
finishing a transmission, a timer, a flow's start. They wait in two heaps:
packet events in one (:meth:`Fabric.schedule`), timers and starts in the
other (:meth:`Fabric.schedule_timer`), and the loop takes the earlier of
the two heads. The order is the one a single heap gives (one sequence
counter numbers both), but a packet event no longer pays for the timers:
every connection keeps a retransmission timer pending for as long as it
lives, so at 144 hosts (41,184 connections) one heap held mostly timers, and
popping a packet event sifted through them (``heappop`` took 46 % of the
pure-Python run's samples of ``benchmarks/dlcp_simulation.py --hosts 144
--skip-iterations``; docs/simulator.md has the numbers). A port that finishes a packet with
nothing queued schedules nothing (``busy_until`` tells the next arrival
when it may start), which keeps idle ports free. Transports
(:mod:`commsched.sim.packet.transport`) never see the clock except as an
argument.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.port import Port


class Packet:
    """One packet on the wire. ``size_bytes`` is what serialises; ``payload_bytes`` what the stream carries.

    ``path``: the equal-cost path the sender picked for this packet (its index modulo the number of
    paths; -1: the fabric picks, by ECMP or spraying). ``info``: what a datagram transport's packet
    carries for its own state machines (DLCP: the transfer and the action), None for TCP.
    """

    __slots__ = (
        "ack",
        "ce",
        "cls",
        "conn",
        "ece",
        "ect",
        "hop",
        "info",
        "is_ack",
        "path",
        "payload_bytes",
        "prio",
        "qseq",
        "route",
        "seq",
        "size_bytes",
        "syn",
        "ts",
        "ts_echo",
    )

    def __init__(
        self,
        seq: int,
        payload_bytes: int,
        size_bytes: int,
        ts: float,
        *,
        is_ack: bool = False,
        ack: int = 0,
        ts_echo: float = 0.0,
        ect: bool = False,
        ece: bool = False,
        cls: int = 0,
        prio: float = 0.0,
        syn: bool = False,
    ) -> None:
        self.seq = seq
        self.payload_bytes = payload_bytes
        self.size_bytes = size_bytes
        self.ts = ts
        self.is_ack = is_ack
        self.ack = ack
        self.ts_echo = ts_echo
        self.ect = ect
        self.ce = False
        self.ece = ece
        self.cls = cls
        self.prio = prio
        self.syn = syn
        self.conn: Any = None
        self.route: tuple[Port, ...] = ()
        self.hop = 0
        self.path = -1
        self.info: Any = None
        self.qseq = -1  # queued at a pFabric port under this number (-1: not)


class Host:
    """An end point: one NIC port, and the connections that terminate here."""

    __slots__ = ("index", "name", "nic", "overhead_s")

    def __init__(self, index: int, name: str, overhead_s: float) -> None:
        self.index = index
        self.name = name
        self.overhead_s = overhead_s
        self.nic: Port | None = None


class Fabric:
    """Hosts, switch ports and routes, plus the packet event loop (module docstring).

    ``paths[(src, dst)]``: the equal-cost routes between two hosts, each a
    tuple of ports. ``injected_bytes``, ``delivered_bytes``, ``dropped_bytes``:
    wire bytes that hosts sent, that reached their destination host, that
    ports dropped (conservation: injected = delivered + dropped + in flight).
    """

    def __init__(self, config: PacketConfig) -> None:
        self.config = config
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []  # packet events
        self._timers: list[tuple[float, int, Callable[[Any], None], Any]] = []  # timers, starts
        self._seq = 0
        self.processed = 0
        self.rng = random.Random(config.seed)
        self.hosts: list[Host] = []
        self.ports: dict[str, Port] = {}
        self.paths: dict[tuple[int, int], list[tuple[Port, ...]]] = {}
        self.injected_bytes = 0
        self.delivered_bytes = 0
        self.dropped_bytes = 0
        self.qseq = 0  # numbers packets as pFabric ports queue them (unique across ports)
        self._spray = config.load_balancing == "spray"

    # ---- building ----

    def add_host(self, name: str, overhead_s: float = 0.0) -> Host:
        host = Host(len(self.hosts), name, overhead_s)
        self.hosts.append(host)
        return host

    def add_port(self, name: str, gbps: float, latency_s: float, *, host: bool = False) -> Port:
        """An output port. ``host``: a host-side port (a NIC, a port inside a node): unbounded, the priority
        bands, no RED or pFabric, pure ACKs first if ``acks_first``; else a switch port with the configured queue."""
        cfg = self.config
        if host:
            port = Port(
                self, name, gbps * 1e9 / 8, latency_s, float("inf"), cfg.priority_classes, None, False, cfg.acks_first
            )
        else:
            port = Port(
                self, name, gbps * 1e9 / 8, latency_s, cfg.buffer_bytes, cfg.priority_classes, cfg.red, cfg.pfabric
            )
        self.ports[name] = port
        return port

    def route(self, conn: Any, src: int, dst: int) -> tuple[Port, ...]:
        """A route for one packet of ``conn``: its ECMP path, or a random one when spraying."""
        paths = self.paths[(src, dst)]
        if len(paths) == 1:
            return paths[0]
        if self._spray:
            return paths[self.rng.randrange(len(paths))]
        return paths[conn.path_hash % len(paths)]

    # ---- events ----

    def schedule(self, time_s: float, callback: Callable[[Any], None], arg: Any) -> None:
        """Run ``callback(arg)`` at ``time_s``: a packet event (soon, and gone once it ran)."""
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, callback, arg))

    def schedule_timer(self, time_s: float, callback: Callable[[Any], None], arg: Any) -> None:
        """The same for a timer or a flow's start: the events that wait long (kept apart from the packets')."""
        self._seq += 1
        heapq.heappush(self._timers, (time_s, self._seq, callback, arg))

    def peek(self) -> float:
        """The time of the next event (INF: none)."""
        heap, timers = self._heap, self._timers
        if heap and timers:
            return min(heap[0][0], timers[0][0])
        if heap:
            return heap[0][0]
        return timers[0][0] if timers else float("inf")

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> None:
        """Run events with time ``<= until`` in ``(time, sequence)`` order; return early once ``stop()`` is
        true after an event."""
        heap = self._heap
        timers = self._timers
        pop = heapq.heappop
        while True:
            if heap:
                first = heap[0]
                source = heap
                if timers:
                    head = timers[0]
                    if head[0] < first[0] or (head[0] == first[0] and head[1] < first[1]):
                        first = head
                        source = timers
            elif timers:
                first = timers[0]
                source = timers
            else:
                return
            if first[0] > until:
                return
            pop(source)
            self.now = first[0]
            self.processed += 1
            first[2](first[3])
            if stop is not None and stop():
                return

    # ---- packets ----

    def send(self, conn: Any, pkt: Packet, src: int, dst: int) -> None:
        """Put ``pkt`` on ``src``'s NIC towards ``dst``."""
        pkt.conn = conn
        if pkt.path < 0:
            pkt.route = self.route(conn, src, dst)
        else:  # the sender chose (source routing)
            paths = self.paths[(src, dst)]
            pkt.route = paths[pkt.path % len(paths)]
        pkt.hop = 0
        self.injected_bytes += pkt.size_bytes
        pkt.route[0].enqueue(pkt)

    def arrive(self, pkt: Packet) -> None:
        """``pkt`` reached the far end of its current hop: queue it at the next port or deliver it."""
        pkt.hop += 1
        if pkt.hop < len(pkt.route):
            pkt.route[pkt.hop].enqueue(pkt)
        else:
            self.delivered_bytes += pkt.size_bytes
            pkt.conn.deliver(pkt)
