"""Transports as clock-free state machines: what a sender and a receiver do with each packet.

A transport is a :class:`Sender` and a :class:`Receiver` for one byte stream
(one connection). Neither reads a clock or schedules anything: every method
takes ``now_s`` and a list ``out`` to append the packets it sends, and each
exposes ``timer_s``, the time it next wants :meth:`on_timer` (``inf`` for
none). The driver, the packet fabric here and a real socket loop elsewhere,
delivers packets and fires timers. A stream is cut into segments of
``segment_bytes``; :meth:`Sender.push` appends a message, the receiver's
``rcv_nxt`` counts segments delivered in order, so the driver knows which
messages have arrived.

:data:`~commsched.sim.packet.registry.TRANSPORTS` names the factories
``PacketConfig.transport`` selects: ``tcp`` (NewReno,
:mod:`commsched.sim.packet.newreno`), ``dctcp`` and ``pfabric``
(:mod:`commsched.sim.packet.variants`), and ``dlcp``
(:mod:`commsched.sim.packet.dlcp`: DLCP's bounded-loss datagrams, driving
the state machines of :mod:`commsched.transport.dlcp`). A new transport is
one :func:`~commsched.sim.packet.registry.register_transport` call with a
factory returning its sender and receiver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.fabric import Packet


@dataclass(frozen=True)
class MessageSpec:
    """What a message is beyond its bytes, for a transport that uses it (TCP ignores it).

    ``loss_bound``: the fraction of its elements the receiver may give up on
    (0: every one arrives); ``priority``: its layer priority class (0: the
    layer nearest the input); ``itemsize``: bytes per element; ``norms``:
    ``norms(stride, numel)`` gives the L2 norm of each packet's chunk when the
    message is cut into packets of ``stride`` elements (None: the transport's
    default); ``phase``: the phase of its exchange it moves (0: a push, 1: a
    pull) and ``step`` the iteration (DLCP sends an earlier step first, then
    an earlier phase).
    """

    loss_bound: float = 0.0
    priority: int = 0
    itemsize: int = 4
    norms: Callable[[int, int], Any] | None = None
    phase: int = 0
    step: int = 0


class Sender(Protocol):
    timer_s: float

    def push(self, nbytes: int, now_s: float, out: list[Packet], spec: MessageSpec | None = None) -> int:
        """Append a message of ``nbytes`` to the stream; return the index it ends at (exclusive), the key
        under which the receiver reports it complete."""
        ...

    def on_ack(self, pkt: Packet, now_s: float, out: list[Packet]) -> None: ...

    def on_timer(self, now_s: float, out: list[Packet]) -> None: ...


class Receiver(Protocol):
    """``rcv_nxt``: the stream is complete, for the application, up to this segment (exclusive).

    TCP advances it over segments received in order. A transport whose
    messages finish out of order (DLCP's datagrams, each message a transfer
    of its own that may end at its loss bound) appends the end index of each
    finished message to ``completed`` instead. The driver completes a message
    once ``rcv_nxt`` reaches the message's end or its end is in ``completed``
    (and clears ``completed``).
    """

    timer_s: float
    rcv_nxt: int
    completed: list[int]

    def on_data(self, pkt: Packet, now_s: float, out: list[Packet]) -> None: ...

    def on_timer(self, now_s: float, out: list[Packet]) -> None: ...


#: Builds the sender and receiver of one connection: ``(config, traffic class) -> (sender, receiver)``.
TransportFactory = Callable[[PacketConfig, int], tuple[Sender, Receiver]]
