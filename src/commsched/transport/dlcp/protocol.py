"""DLCP's bounded-loss transfer as clock-free state machines (MLT, NSDI'24; DLCP, arXiv 2008.08445).

One transfer is ``numel`` elements cut on a grid of ``stride`` elements per
packet. The sender (:class:`~commsched.transport.dlcp.sender.SenderState`,
in its own module) sends each packet once, in its order, then PROBEs; the
:class:`ReceiverState` here keeps a bitmap of the packets it has, and
once at most ``floor(loss_bound · numel)`` elements are missing it STOPs the
sender; until then it answers a PROBE with a BITMAP of its holes and the
sender re-sends exactly those. Holes are re-sent in mid-stream too: a gap in
a peer's datagram numbers that outlives a few later ones
(:class:`PeerFeedback`) makes every receive from that peer report its holes
unasked (:meth:`ReceiverState.report`), and the sender re-sends those it
sent before the gap that the bound cannot spare. A deadline is only a
safety net for a sender that died.

Nothing here reads a clock, owns a socket or starts a thread: methods take
``now_s`` where time matters and append what to send to ``out``
(:data:`Action`: :class:`Data`, :class:`Probe`, :class:`Stop`,
:class:`Bitmap`, :class:`Ack`), so the real link and the packet-level
simulator drive the same code. Writing a packet's payload is the caller's
business: :meth:`ReceiverState.on_data` says whether it is new and in range.

Importance (DLCP's selective dropping): :func:`classify` marks a packet
important when its chunk's L2 norm is at least the ``quantile`` of the
tensor's chunk norms, or its layer class is one of the first
``important_layer_classes``; :func:`tos_byte` gives the IP TOS byte a packet
goes out with (important: the layer's DSCP class and ECN-capable; otherwise
best effort and not ECN-capable, so a RED queue drops it where it would mark
an important one).
"""

from __future__ import annotations

import math
from enum import IntEnum
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from commsched.transport.dlcp.wire import MAX_HOLES, NO_ECHO, NO_SAMPLE

INF = math.inf


class Data(NamedTuple):
    """Send the packet of elements ``[offset, offset + numel)``; ``important``: 1 or 0."""

    offset: int
    numel: int
    important: int
    resend: bool


class Probe(NamedTuple):
    """Every packet was sent once: ask for the holes (``seq`` numbers the probes of a transfer)."""

    seq: int


class Stop(NamedTuple):
    """The receive is finished with ``received`` elements: send nothing more."""

    received: int


#: Later datagram numbers a gap must outlive before the receiver reports it (per path: :class:`PeerFeedback`).
REORDER = 3
#: A :class:`Bitmap`'s ``seq`` when no probe asked for it: the receiver reports holes on seeing a gap in the
#: sender's datagram numbers (probes number from 1).
REPORT = 0


class Bitmap(NamedTuple):
    """Element ranges ``[start, stop)`` still missing (at most MAX_HOLES): the answer to probe ``seq``, or, with
    ``seq`` :data:`REPORT`, a report the receiver sent unasked: every DATA datagram numbered before ``below``
    (32-bit sequence numbers) that has not arrived is lost, and the receive may end with ``allowed`` elements
    missing (its bound)."""

    seq: int
    holes: tuple[tuple[int, int], ...]
    below: int = 0
    allowed: int = 0


class Ack(NamedTuple):
    """Per peer, cumulative: DATA datagrams sent (highest sequence number seen + 1), received, received CE-marked.

    ``echo``: the sequence number of the datagram that triggered this Ack
    (the sender's round-trip sample), NO_ECHO when a timer sent it, or
    NO_SAMPLE when it repeats the last one (no sample: the repeat waited for
    the receiver's timer, not for the path).
    """

    sent: int
    received: int
    ce: int
    echo: int = NO_ECHO


Action = Data | Probe | Stop | Bitmap | Ack


class Accept(IntEnum):
    """What :meth:`ReceiverState.on_data` made of a packet. Only NEW is to be written."""

    NEW = 0
    DUPLICATE = 1
    LATE = 2  # the receive already ended
    MISMATCH = 3  # not on the transfer's grid (another stride, size or offset)


# ---------------------------------------------------------------- importance


def classify(
    chunk_norms: np.ndarray, layer_class: int, quantile: float = 0.5, *, important_layer_classes: int = 1
) -> np.ndarray:
    """Per packet: 1 (important) or 0, as ``uint8``.

    A packet is important if its chunk's L2 norm is ≥ the ``quantile`` of
    ``chunk_norms`` (numpy's linear interpolation; NaN norms count as
    important), or if ``layer_class < important_layer_classes`` (default: the
    layer class nearest the input, which the next forward pass needs first).
    ``quantile`` 0 marks every packet important; 1 only the largest.
    """
    norms = np.asarray(chunk_norms, dtype=np.float64)
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    if layer_class < important_layer_classes or norms.size == 0:
        return np.ones(norms.size, dtype=np.uint8)
    finite = norms[np.isfinite(norms)]
    threshold = np.quantile(finite, quantile) if finite.size else 0.0
    return (~(norms < threshold)).astype(np.uint8)


#: DSCP of an important packet by layer priority class 0, 1, 2, 3+ (class selectors CS4..CS1).
LAYER_DSCP = (32, 24, 16, 8)
#: The ECN field's ECT(0) codepoint, and CE (congestion experienced).
ECT0 = 0b10
CE = 0b11


def tos_byte(priority_class: int, important: bool) -> int:
    """The IP TOS byte ``DSCP << 2 | ECN``: important → the layer's class, ECT(0); else CS0, not ECT.

    Strict-priority switch queues then serve important packets of every
    layer, front layers first, before any unimportant one, and RED drops
    unimportant packets where it would ECN-mark important ones.
    """
    if not important:
        return 0
    return LAYER_DSCP[min(max(priority_class, 0), len(LAYER_DSCP) - 1)] << 2 | ECT0


def send_order(step: int, phase: int, layer_class: int) -> tuple[int, int, int]:
    """Which send to a destination goes first (least first; among equals the first posted): the earliest step,
    so that no push of the next step holds a peer waiting for this step's pulls; then the earliest phase, a
    step's pushes before its pulls, since a peer's pull of a slice waits for its pushes; then the layer class.
    The link (:class:`~commsched.transport.dlcp.outbound.Outbound`) and the packet simulator both order by it."""
    return step, phase, layer_class


# ---------------------------------------------------------------- the receiver


def allowed_missing(numel: int, loss_bound: float) -> int:
    """``floor(loss_bound · numel)``, exactly (the float's exact value, no rounding up)."""
    if not 0.0 <= loss_bound <= 1.0:
        raise ValueError(f"loss_bound must be in [0, 1], got {loss_bound}")
    return math.floor(Fraction(loss_bound) * numel)


class ReceiverState:
    """One receive of ``numel`` elements that may end with at most ``floor(loss_bound · numel)`` missing.

    When: by default only once the sender has sent every packet once (its
    first :class:`Probe`), so a loss-free path loses nothing and the bound
    only spares waiting for re-sends of what the network lost (beyond it, a
    :class:`Bitmap` asks for them and the re-sends end it at the bound). With
    ``stop_at_count`` (MLT's rule) as soon as ``1 − loss_bound`` arrived.
    It ends (``ended``, one :class:`Stop`) under that rule, else only by
    :meth:`deadline` or :meth:`cancel`; ``ended`` is ``"complete"`` (nothing
    missing) or ``"bound"``, never with more than the bound missing; at
    ``loss_bound`` 0 only with every element. After it ends, every packet is
    LATE (never to be written). The packet grid (``stride``) is learnt from
    the first packet; packets on another grid are MISMATCH.
    """

    __slots__ = ("_got", "allowed", "deadline_s", "duplicates", "ended", "numel", "probed", "received",
                 "stop_at_count", "stride")  # fmt: skip

    def __init__(
        self, numel: int, loss_bound: float = 0.0, deadline_s: float = INF, *, stop_at_count: bool = False
    ) -> None:
        self.numel = numel
        self.allowed = allowed_missing(numel, loss_bound)
        self.deadline_s = deadline_s
        self.stop_at_count = stop_at_count
        self.probed = False  # the sender has sent every packet once
        self.stride = 0
        self._got: np.ndarray | None = None
        self.received = 0
        self.duplicates = 0
        self.ended: str | None = "complete" if numel == 0 else None

    def on_data(self, offset: int, numel: int, stride: int, out: list[Action]) -> Accept:
        """Account for one packet; NEW means: write its payload at ``offset``. Appends Stop on finishing."""
        if self.ended is not None:
            return Accept.LATE
        if self._got is None:
            if stride < 1:
                return Accept.MISMATCH
            self.stride = stride
            self._got = np.zeros(-(-self.numel // stride), dtype=bool)
        if stride != self.stride or offset % stride or not 0 <= offset < self.numel:
            return Accept.MISMATCH
        if numel != min(stride, self.numel - offset):
            return Accept.MISMATCH
        index = offset // stride
        if self._got[index]:
            self.duplicates += 1
            return Accept.DUPLICATE
        self._got[index] = True
        self.received += numel
        if self.received == self.numel:
            self.ended = "complete"
            out.append(Stop(self.received))
        elif (self.probed or self.stop_at_count) and self.numel - self.received <= self.allowed:
            self.ended = "bound"
            out.append(Stop(self.received))
        return Accept.NEW

    def on_probe(self, seq: int, out: list[Action]) -> None:
        """Answer probe ``seq``: Stop if the receive has ended or the holes are within the bound, else a Bitmap."""
        self.probed = True
        if self.ended is None and self.numel - self.received <= self.allowed:
            self.ended = "bound"
        if self.ended is not None:
            out.append(Stop(self.received))
        else:
            out.append(Bitmap(seq, self.missing()[:MAX_HOLES]))

    def report(self, below: int, out: list[Action]) -> None:
        """Report the holes unasked (:data:`REPORT`): datagrams numbered before ``below`` did not arrive and may be
        this receive's; the sender re-sends those of the holes it sent before ``below`` that its bound cannot
        spare. Nothing once ended, or before anything arrived (its sender may not have started)."""
        if self.ended is None and self._got is not None:
            out.append(Bitmap(REPORT, self.missing()[:MAX_HOLES], below, self.allowed))

    def deadline(self, now_s: float, out: list[Action]) -> bool:
        """The safety net: at ``deadline_s`` end with what arrived (``"deadline"``) and Stop. True if it ended now."""
        if self.ended is None and now_s >= self.deadline_s:
            self.ended = "deadline"
            out.append(Stop(self.received))
            return True
        return False

    def cancel(self, out: list[Action]) -> None:
        """End now (the caller gave up waiting); Stop the sender."""
        if self.ended is None:
            self.ended = "cancelled"
            out.append(Stop(self.received))

    def missing(self) -> tuple[tuple[int, int], ...]:
        """Element ranges ``[start, stop)`` not received, in order."""
        if self._got is None:
            return ((0, self.numel),) if self.numel else ()
        return _runs(self._got, self.stride, self.numel)

    @property
    def lost(self) -> int:
        """Elements not received."""
        return self.numel - self.received


def _runs(got: np.ndarray, stride: int, numel: int) -> tuple[tuple[int, int], ...]:
    """Runs of False in ``got`` as element ranges."""
    idx = np.flatnonzero(~got)
    if idx.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]])) + 1
    return tuple((int(a) * stride, min(int(b) * stride, numel)) for a, b in zip(starts, ends, strict=True))


#: A receiver acknowledges about every this many bytes of datagrams (:func:`datagrams_per_ack`). Each ACK costs
#: both I/O threads a system call, a MAC and a wake-up on the core the training computes on: at 48 KiB (5
#: datagrams of 9000 bytes) `dlcp` ran 1.03-1.22x `ps`'s iteration, at 96 KiB 0.97-1.13x (BENCHMARKS.md,
#: "Fewer ACKs").
ACK_EVERY_BYTES = 96 * 1024


def datagrams_per_ack(mtu_bytes: int, every_bytes: int = ACK_EVERY_BYTES) -> int:
    """How many datagrams a receiver takes before it ACKs: about ``every_bytes`` of them, at least 4."""
    return max(4, every_bytes // mtu_bytes)


class PeerFeedback:
    """Receiver side, per sending peer: counts DATA datagrams by sequence number and CE mark for rate control.

    Sequence numbers are 32-bit and wrap; ``sent`` is the highest seen + 1,
    unwrapped (a datagram behind the highest, reordered, does not move it).
    An :class:`Ack` goes out every ``every`` datagrams, and on
    :meth:`on_timer` when some are unacknowledged for ``interval_s``. An Ack
    that no datagram followed for ``interval_s`` goes once more (echo
    NO_SAMPLE): Acks travel as datagrams and can be lost, and a sender whose
    window is full sends nothing until one arrives, so a lost last Ack would
    hold it until its feedback timeout (50 ms; on the testbed at 1 % loss,
    90 feedback timeouts in 1,020 rounds of ``benchmarks/dlcp_tails.py``
    before the repeat, most with the window full).

    Loss is seen here first: :meth:`on_data` returns the sequence number
    before which every datagram not arrived counts as lost once a gap in the
    numbers (``sent − received`` grew) outlived ``reorder`` more numbers, as
    TCP's three duplicate ACKs; the receiver then reports its holes
    (:meth:`ReceiverState.report`) and the sender re-sends in mid-stream what
    it sent before that number, not only after its PROBE at the transfer's
    end. A datagram overtaken by ``reorder`` later ones (spraying over paths
    of unequal delay) is re-sent for nothing: a duplicate, not an error.
    """

    __slots__ = ("_gap_at", "_last_ack_s", "_last_seq", "_repeat_s", "_reported", "_unacked", "ce", "every",
                 "interval_s", "received", "reorder", "sent")  # fmt: skip

    def __init__(self, every: int = 32, interval_s: float = 0.005, reorder: int = 3) -> None:
        if reorder < 1:
            raise ValueError(f"reorder must be >= 1, got {reorder}")
        self.every = every
        self.interval_s = interval_s
        self.reorder = reorder
        self.sent = 0
        self.received = 0
        self.ce = 0
        self._last_seq = 2**32 - 1
        self._unacked = 0
        self._last_ack_s = -INF
        self._repeat_s = INF  # when the last Ack goes again, if no datagram comes before
        self._reported = 0  # the gaps (sent − received) reported so far
        self._gap_at = -1  # ``sent`` when gaps beyond those reported were first seen (-1: none)

    def on_data(self, seq: int, ce: bool, now_s: float, out: list[Action]) -> int | None:
        """Count datagram ``seq``; append an Ack when one is due. Returns, when a gap outlived ``reorder``
        numbers, the 32-bit number before which what has not arrived is lost (else None)."""
        ahead = (seq - self._last_seq) % 2**32
        if ahead < 2**31 or not self.received:  # the sender numbers from 0
            self.sent += ahead
            self._last_seq = seq
        self.received += 1
        self.ce += ce
        self._unacked += 1
        self._repeat_s = INF
        if self._unacked >= self.every:
            self._ack(now_s, seq, out)
        gaps = self.sent - self.received
        if gaps <= self._reported:  # a late datagram filled a gap
            self._reported, self._gap_at = gaps, -1
            return None
        if self._gap_at < 0:
            self._gap_at = self.sent
        elif self.sent - self._gap_at >= self.reorder:
            self._reported, self._gap_at = gaps, -1
            return (self.sent - self.reorder) % 2**32
        return None

    @property
    def timer_s(self) -> float:
        """When :meth:`on_timer` next has an Ack to send (INF: none, nothing unacknowledged nor to repeat)."""
        return self._last_ack_s + self.interval_s if self._unacked else self._repeat_s

    def on_timer(self, now_s: float, out: list[Action]) -> None:
        if self._unacked and now_s >= self._last_ack_s + self.interval_s:  # as timer_s says, to the last bit
            self._ack(now_s, NO_ECHO, out)
        elif not self._unacked and now_s >= self._repeat_s:
            self._repeat_s = INF
            out.append(Ack(self.sent, self.received, self.ce, NO_SAMPLE))

    def _ack(self, now_s: float, echo: int, out: list[Action]) -> None:
        self._unacked = 0
        self._last_ack_s = now_s
        self._repeat_s = now_s + self.interval_s
        out.append(Ack(self.sent, self.received, self.ce, echo))
