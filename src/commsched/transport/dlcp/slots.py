"""What a DLCP link keeps per transfer and in total: posted sends and receives, records, counters."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from commsched.transport.dlcp.protocol import ReceiverState
from commsched.transport.dlcp.sender import SenderState
from commsched.transport.links import TransferKey

if TYPE_CHECKING:
    from commsched.transport.dlcp.link import DlcpTransfer


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """How one receive ended: ``ended`` is ``"complete"``, ``"bound"``, ``"deadline"`` or ``"cancelled"``."""

    peer: int
    key: TransferKey
    numel: int
    lost_numel: int
    ended: str


@dataclass
class LinkStats:
    """Counters of one link (datagrams unless named otherwise); ``rejected`` counts by the reason they failed.

    ``received``: datagrams read from the data sockets, good or bad, control
    datagrams included (``ecn_capable`` of the valid DATA ones arrived ECT or
    CE, ``ce_marked`` CE); ``sent``: DATA datagrams only;
    ``written``: those written into a receive; ``duplicate``, ``late`` (for a
    finished receive), ``stale`` (a step too old), ``mismatch`` (wrong dtype,
    size or grid for the posted receive), ``early_buffered`` /
    ``early_dropped`` (for a receive not yet posted): valid datagrams not
    written. ``probes`` sent (a sender that ran out of datagrams asking for
    the holes) and ``bitmaps`` sent (this receiver's answers naming holes,
    and its ``reports``: holes sent unasked on a gap in a peer's datagram
    numbers); ``resent_on_report``: packets this sender queued again on a
    report, in mid-stream;
    ``probes_held_out``: probes answered because ``inbound.PROBE_HOLD_S``
    passed before the datagrams sent before them arrived (lost, or still
    queued).
    ``control_sent`` / ``control_received``: control messages written on
    the TCP connections / read from them or, as datagrams, from the data
    sockets; ``control_datagrams_sent``: those sent as datagrams;
    ``control_duplicate``: a second copy of a STOP or BITMAP for a send
    already finished; ``control_unmatched``: one for no send or receive
    this link knows.
    ``records``: the last 4096 receives, how each ended.
    ``send_calls`` / ``recv_calls``: the system calls that sent and read
    the data datagrams (fewer than the datagrams where UDP GSO / GRO batch
    them); ``gso_refused``: GSO sends a route refused (that path then sends
    one datagram per call).
    ``turns``: turns of the I/O thread's loop; ``idle_turns``: those that
    woke on a timer with no socket ready; ``host_queue_full``: turns that
    sent nothing because this host still held two pacer bursts of a path's
    datagrams (:mod:`~commsched.transport.dlcp.outbound`).
    """

    sent: int = 0
    sent_bytes: int = 0
    resent: int = 0
    dropped_by_hook: int = 0
    send_errors: int = 0
    received: int = 0
    ecn_capable: int = 0
    ce_marked: int = 0
    written: int = 0
    duplicate: int = 0
    late: int = 0
    stale: int = 0
    mismatch: int = 0
    early_buffered: int = 0
    early_dropped: int = 0
    control_sent: int = 0
    control_received: int = 0
    control_datagrams_sent: int = 0
    control_duplicate: int = 0
    probes: int = 0
    bitmaps: int = 0
    reports: int = 0
    resent_on_report: int = 0
    probes_held_out: int = 0
    control_unmatched: int = 0
    connections_refused: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    received_per_path: list[int] = field(default_factory=list)
    send_calls: int = 0
    recv_calls: int = 0
    gso_refused: int = 0
    turns: int = 0
    idle_turns: int = 0
    host_queue_full: int = 0
    rcvbuf_requested_bytes: int = 0
    rcvbuf_granted_bytes: int = 0
    rmem_max_bytes: int | None = None
    records: deque[TransferRecord] = field(default_factory=lambda: deque(maxlen=4096))

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class SendSlot:
    __slots__ = ("_importance_of", "deadline_s", "dtype", "importance", "itemsize", "key", "numel", "peer", "prio",
                 "state", "stride", "transfer", "view")  # fmt: skip

    def __init__(self, peer: int, key: TransferKey, view: memoryview, numel: int, itemsize: int, dtype: int,
                 stride: int, prio: int, importance: np.ndarray | None,
                 importance_of: Callable[[], np.ndarray] | None = None) -> None:  # fmt: skip
        self.peer, self.key, self.view, self.numel, self.itemsize = peer, key, view, numel, itemsize
        self.dtype, self.stride, self.prio, self.importance = dtype, stride, min(max(prio, 0), 255), importance
        # PROBE the state machine's 2 ms after the last datagram, not the packet-level simulator's
        # max(floor, 2·srtt): the receiver holds a PROBE until the datagrams sent before it arrived
        # (inbound.PROBE_HOLD_S), so an early one re-sends nothing for nothing, and a reliable pull's lost datagram
        # is asked for sooner (BENCHMARKS.md, "DLCP's tails again": the two delays measured alike)
        self.state = SenderState(numel, stride, importance)
        #: classifies the packets when called: left to the I/O thread, which calls it before the first packet goes
        self._importance_of = importance_of
        self.deadline_s = 0.0
        self.transfer: DlcpTransfer | None = None

    @property
    def unclassified(self) -> bool:
        """Its packets wait for :meth:`classify`, a pass over its data."""
        return self._importance_of is not None

    def classify(self) -> None:
        """Order the packets by importance, if that was left until now (:meth:`DlcpLink.send
        <commsched.transport.dlcp.link.DlcpLink.send>`); only before the first packet went."""
        importance_of, self._importance_of = self._importance_of, None
        if importance_of is not None and self.state.sent == 0 and not self.state.done:
            self.importance = importance_of()
            self.state = SenderState(self.numel, self.stride, self.importance)

    def describe(self) -> str:
        return f"send of {self.numel} elements to rank {self.peer}, {self.key}"


class RecvSlot:
    __slots__ = ("dtype", "itemsize", "key", "loss_bound", "numel", "peer", "state", "transfer", "view")

    def __init__(self, peer: int, key: TransferKey, view: memoryview, numel: int, itemsize: int, dtype: int,
                 loss_bound: float) -> None:  # fmt: skip
        self.peer, self.key, self.view, self.numel, self.itemsize = peer, key, view, numel, itemsize
        self.dtype, self.loss_bound = dtype, loss_bound
        self.state = ReceiverState(numel, loss_bound)  # replaced with a deadline when posted
        self.transfer: DlcpTransfer | None = None

    def describe(self) -> str:
        return f"receive of {self.numel} elements from rank {self.peer}, {self.key}, loss bound {self.loss_bound}"
