"""A connection: one transport's sender and receiver, driven by the fabric's events.

The connection is the only place where transports meet the clock: it hands
them ``fabric.now``, sends what they return, and fires their timers. A
timer is lazy: when a deadline moves later, the pending event stays and,
when it fires early, re-arms at the new deadline, so pushing a deadline
forward on every ACK costs nothing; when it moves earlier, an event is
scheduled for it and the later one, superseded, does nothing when it fires
(each event carries the deadline it was armed for).

Messages: :meth:`Connection.message` appends ``nbytes`` to the stream and
calls ``done()`` once the receiver has every segment of it in order (or, for
a transport whose messages end out of order, once the receiver says so).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from commsched.sim.packet.fabric import Fabric, Packet
from commsched.sim.packet.transport import MessageSpec, Receiver, Sender

INF = math.inf


class Connection:
    """``src`` host to ``dst`` host, one traffic class; counts ``drops`` and ``marks`` of its packets."""

    __slots__ = (
        "_messages",
        "_out",
        "_rx_timer",
        "_tx_timer",
        "cls",
        "drops",
        "dst",
        "fabric",
        "marks",
        "name",
        "path_hash",
        "receiver",
        "sender",
        "src",
    )

    def __init__(
        self, fabric: Fabric, src: int, dst: int, cls: int, sender: Sender, receiver: Receiver, path_hash: int
    ) -> None:
        self.fabric = fabric
        self.src = src
        self.dst = dst
        self.cls = cls
        self.sender = sender
        self.receiver = receiver
        self.path_hash = path_hash
        self.name = f"{fabric.hosts[src].name}->{fabric.hosts[dst].name}/c{cls}"
        self.drops = 0
        self.marks = 0
        self._messages: deque[tuple[int, Callable[[], None]]] = deque()
        self._out: list[Packet] = []
        self._tx_timer = INF
        self._rx_timer = INF

    def message(self, nbytes: int, done: Callable[[], None], spec: MessageSpec | None = None) -> None:
        """Send ``nbytes`` now; ``done()`` when all of it has arrived (at once for an empty message), or for
        a bounded-loss transport when the receiver has given up on the rest (``spec.loss_bound``)."""
        if nbytes <= 0:
            self.fabric.schedule(self.fabric.now, lambda _: done(), None)
            return
        out = self._out
        end = self.sender.push(nbytes, self.fabric.now, out, spec)
        self._messages.append((end, done))
        self._flush_tx()

    # ---- driving the transport ----

    def _flush_tx(self) -> None:
        out = self._out
        if out:
            fabric, src, dst = self.fabric, self.src, self.dst
            for pkt in out:
                fabric.send(self, pkt, src, dst)
            out.clear()
        deadline = self.sender.timer_s
        if deadline < self._tx_timer:
            self._tx_timer = deadline
            self.fabric.schedule_timer(deadline, self._fire_tx, deadline)

    def _flush_rx(self) -> None:
        out = self._out
        if out:
            fabric, src, dst = self.fabric, self.dst, self.src
            for pkt in out:
                fabric.send(self, pkt, src, dst)
            out.clear()
        deadline = self.receiver.timer_s
        if deadline < self._rx_timer:
            self._rx_timer = deadline
            self.fabric.schedule_timer(deadline, self._fire_rx, deadline)

    def _fire_tx(self, armed_s: float) -> None:
        if armed_s != self._tx_timer:
            return  # superseded by an earlier deadline, which fired and re-armed
        self._tx_timer = INF
        now = self.fabric.now
        if self.sender.timer_s <= now:
            self.sender.on_timer(now, self._out)
        self._flush_tx()

    def _fire_rx(self, armed_s: float) -> None:
        if armed_s != self._rx_timer:
            return
        self._rx_timer = INF
        now = self.fabric.now
        if self.receiver.timer_s <= now:
            self.receiver.on_timer(now, self._out)
        self._flush_rx()

    def deliver(self, pkt: Packet) -> None:
        """A packet of this connection reached its destination host (data at ``dst``, ACK at ``src``)."""
        now = self.fabric.now
        if pkt.is_ack:
            self.sender.on_ack(pkt, now, self._out)
            self._flush_tx()
            return
        receiver = self.receiver
        receiver.on_data(pkt, now, self._out)
        self._flush_rx()
        messages = self._messages
        if receiver.completed:  # out of order (bounded-loss datagrams)
            for end in receiver.completed:
                for i, (e, done) in enumerate(messages):
                    if e == end:
                        del messages[i]
                        done()
                        break
            receiver.completed.clear()
        while messages and receiver.rcv_nxt >= messages[0][0]:
            messages.popleft()[1]()
