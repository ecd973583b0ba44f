"""DLCP's sender as a clock-free state machine: one send's packets in importance order, PROBEs, re-sends.

The other half of :mod:`commsched.transport.dlcp.protocol` (the receiver,
the messages both exchange, importance and TOS marking): what the sender
does with a transfer's packets, driven by the real link
(:mod:`~commsched.transport.dlcp.slots`) and by the packet-level simulator
(:mod:`commsched.sim.packet.dlcp`) alike. Nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from commsched.transport.dlcp.protocol import INF, REPORT, Action, Data, Probe


class SenderState:
    """One send of ``numel`` elements in packets of ``stride`` elements.

    Order: important packets first, then the rest, each in offset order.
    The receiver stops at the bound, so whatever is still unsent then is
    what the loss budget is spent on: sending important packets first puts
    the budget on small-magnitude chunks (and the network's drops too: they
    travel later, at a lower priority, not ECN-capable).

    :meth:`next_packets` hands out up to ``budget`` packets: queued re-sends
    first, then new ones. A hole a :class:`~commsched.transport.dlcp.protocol.Bitmap` asks for goes again
    important whatever its chunk's class: the receiver needs it to reach the
    bound. Once everything was sent it emits a :class:`~commsched.transport.dlcp.protocol.Probe`
    ``probe_delay_s`` after the last packet (so the last datagrams can land
    first), and again every ``probe_timeout_s`` while unanswered. A
    :class:`~commsched.transport.dlcp.protocol.Bitmap` answering the latest probe queues its holes for re-send;
    :meth:`on_stop` ends the send and drops the rest. ``wake_s`` is when it
    next wants :meth:`next_packets` called with nothing queued (INF: never).

    Holes are also re-sent in mid-stream: the link tells :meth:`numbered` the
    sequence number each packet left with, and a Bitmap the receiver sent
    unasked (seq :data:`~commsched.transport.dlcp.protocol.REPORT`, on a gap in
    those numbers) queues the holes that left before its ``below``
    (``reported`` counts them); the others are still on their way, or unsent.
    A report also says how many elements the receive may miss: the lost
    packets that fit in it, unimportant ones first, are not re-sent
    (``spared`` elements), as a PROBE's answer would not have asked for them.
    """

    __slots__ = (
        "_important", "_order", "_pos", "_queued", "_resend", "_seq", "answered", "done", "numel", "probe_delay_s",
        "probe_seq", "probe_timeout_s", "reported", "resent", "sent", "spared", "stride", "wake_s",
    )  # fmt: skip

    def __init__(
        self,
        numel: int,
        stride: int,
        importance: np.ndarray | None = None,
        *,
        probe_delay_s: float = 0.002,
        probe_timeout_s: float = 0.2,
    ) -> None:
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        packets = -(-numel // stride)
        self.numel = numel
        self.stride = stride
        if importance is None:
            self._important = np.ones(packets, dtype=np.uint8)
            self._order = np.arange(packets)
        else:
            if len(importance) != packets:
                raise ValueError(f"{len(importance)} importance classes for {packets} packets")
            self._important = np.array(importance, dtype=np.uint8)  # a copy: holes asked for become important
            self._order = np.argsort(-self._important.astype(np.int8), kind="stable")
        self._pos = 0
        self._seq = np.full(packets, -1, dtype=np.int64)  # per packet: the number its last send left with
        self._resend: deque[int] = deque()
        self._queued: set[int] = set()
        self.done = numel == 0
        self.probe_seq = 0
        self.answered = 0  # the probe whose answer was taken
        self.probe_delay_s = probe_delay_s
        self.probe_timeout_s = probe_timeout_s
        self.sent = 0
        self.resent = 0
        self.reported = 0
        self.spared = 0
        self.wake_s = INF

    @property
    def pending(self) -> bool:
        """Packets are queued to go out now."""
        return not self.done and (bool(self._resend) or self._pos < len(self._order))

    def next_packets(self, now_s: float, budget: int, out: list[Action]) -> None:
        """Append up to ``budget`` Data, then a Probe if nothing is left and one is due."""
        if self.done:
            return
        emitted = 0
        while emitted < budget and self._resend:
            index = self._resend.popleft()
            self._queued.discard(index)
            out.append(self._data(index, True))
            emitted += 1
        self.resent += emitted
        while emitted < budget and self._pos < len(self._order):
            out.append(self._data(int(self._order[self._pos]), False))
            self._pos += 1
            self.sent += 1
            emitted += 1
        if self.pending:
            return
        if emitted:
            self.wake_s = now_s + self.probe_delay_s
        elif now_s >= self.wake_s:
            self.probe_seq += 1
            self.wake_s = now_s + self.probe_timeout_s
            out.append(Probe(self.probe_seq))

    def _data(self, index: int, resend: bool) -> Data:
        offset = index * self.stride
        return Data(offset, min(self.stride, self.numel - offset), int(self._important[index]), resend)

    def numbered(self, offset: int, seq: int) -> None:
        """The packet at ``offset`` left (or is about to) as DATA datagram ``seq`` (32 bits)."""
        self._seq[offset // self.stride] = seq

    def on_bitmap(
        self, seq: int, holes: tuple[tuple[int, int], ...] | list[tuple[int, int]], below: int = 0, allowed: int = 0
    ) -> None:
        """Queue the packets covering ``holes`` for re-send (important first); ignore an answer to an older
        probe, and a second answer to the latest (a link may carry each answer twice). A report (seq
        :data:`~commsched.transport.dlcp.protocol.REPORT`) queues only the holes numbered before ``below``, and of
        those only what ``allowed`` missing elements cannot spare."""
        if self.done:
            return
        wanted: set[int] = set()
        if seq == REPORT:
            for start, stop in holes:
                first = start // self.stride
                numbers = self._seq[first : -(-stop // self.stride)]
                behind = (below - numbers) % 2**32
                lost = np.flatnonzero((numbers >= 0) & (behind > 0) & (behind < 2**31))
                numbers[lost] = -1  # its re-send is numbered anew; a spared one is never reported again
                wanted.update((lost + first).tolist())
            wanted -= self._queued
            for index in sorted(wanted, key=lambda i: (int(self._important[i]), i)):  # unimportant first
                size = min(self.stride, self.numel - index * self.stride)
                if self.spared + size > allowed:
                    break
                self.spared += size
                wanted.discard(index)
            self.reported += len(wanted)
        elif seq != self.probe_seq or seq == self.answered:
            return
        else:
            self.answered = seq
            for start, stop in holes:
                wanted.update(range(start // self.stride, -(-stop // self.stride)))
            wanted -= self._queued
        if not wanted:
            return
        ordered = sorted(wanted, key=lambda i: (-int(self._important[i]), i))
        self._important[ordered] = 1  # the receiver needs them to reach the bound: not to be dropped again
        self._resend.extend(ordered)
        self._queued.update(ordered)
        self.wake_s = INF

    def requeue(self, offset: int) -> None:
        """The packet at ``offset`` could not leave this host (a full send buffer): send it again next."""
        index = offset // self.stride
        if not self.done and index not in self._queued:
            self._resend.appendleft(index)
            self._queued.add(index)
            self.wake_s = INF

    def on_stop(self) -> None:
        """The receiver is finished: send nothing more."""
        self.done = True
        self._resend.clear()
        self._queued.clear()
        self.wake_s = INF
