"""DLCP in the packet network: the real link's state machines, driven by fabric events.

The ``dlcp`` transport (:data:`~commsched.sim.packet.registry.TRANSPORTS`)
is a :class:`DlcpSender` and a :class:`DlcpReceiver` per ordered pair of
hosts, and they hold exactly what the UDP link's I/O thread holds
(:mod:`commsched.transport.dlcp.engine`): per message a
:class:`~commsched.transport.dlcp.sender.SenderState` and a
:class:`~commsched.transport.dlcp.protocol.ReceiverState` (bounded-loss
completion, by the link's rule or, with ``dlcp.stop_at_count``, MLT's: STOP
at ``1 − loss_bound``; PROBE, BITMAP, selective re-send),
per destination a :class:`~commsched.transport.dlcp.rate.RateControl`, per
source a :class:`~commsched.transport.dlcp.protocol.PeerFeedback`. Packets
are marked as the link marks them: importance by
:func:`~commsched.transport.dlcp.protocol.classify` over the chunk norms of
the message, then :func:`~commsched.transport.dlcp.protocol.tos_byte` gives
the DSCP (which picks the strict-priority band, :func:`band_of`) and the
ECN capability. Nothing of the protocol is re-implemented here: this module
only turns actions into packets and packets into calls, as the engine turns
them into datagrams.

What differs from the link, by construction of a simulator:

* a message's receive is posted when its send is (the runtime's exchange
  posts both before any data moves), so no datagram arrives early;
* control (STOP, PROBE, BITMAP, ACK) travels as one packet each in the top
  band, ECN-capable, as the link's datagram copies do; the link also sends
  STOP, PROBE and BITMAP on a TCP connection, so where both copies of one
  are lost there TCP recovers it, here the sender's next PROBE
  (``probe_timeout_s``);
* the engine ticks every millisecond; here each timer fires when it is due
  (:attr:`~commsched.transport.dlcp.rate.RateControl.timer_s`,
  :attr:`~commsched.transport.dlcp.protocol.PeerFeedback.timer_s`,
  ``SenderState.wake_s``, the pacer's delay); the receive deadline (a safety
  net for a dead peer) is not armed;
* a receiver reports holes once a gap in the numbers outlives
  :data:`~commsched.transport.dlcp.protocol.REORDER` later ones whatever the
  paths; the link allows that many per path of its own (its sprayed paths
  may be links of unequal delay; a fabric's equal-cost paths have equal
  links, and only their queues reorder).

The sender serves the most urgent message first (earliest step, then
earliest phase, then lowest layer class; among equals the first posted), one
datagram whenever the pacer and the window allow, as the engine does. It PROBEs ``max(probe_delay_s, 2·srtt)`` after a
message's last datagram (the state machine's ``probe_delay_s``, set from the
rate control's smoothed round trip, which includes queueing): a PROBE that
overtakes datagrams still queued would have their holes re-sent for
nothing. With ``dlcp.spray`` a datagram takes the path of its sequence
number modulo the equal-cost paths (the link's per-datagram round-robin over
its path sockets).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.fabric import Packet
from commsched.sim.packet.registry import register_transport
from commsched.sim.packet.transport import MessageSpec, Receiver, Sender
from commsched.transport.dlcp.protocol import (
    ECT0,
    LAYER_DSCP,
    Accept,
    Ack,
    Action,
    Bitmap,
    Data,
    PeerFeedback,
    Probe,
    ReceiverState,
    Stop,
    classify,
    datagrams_per_ack,
    send_order,
    tos_byte,
)
from commsched.transport.dlcp.rate import RateControl, RateParams
from commsched.transport.dlcp.sender import SenderState
from commsched.transport.dlcp.wire import ACK, HEADER, HOLE, IPV4_UDP_BYTES, MAC_BYTES, packet_numel

INF = math.inf
#: Bytes a datagram adds to its payload on the wire: IPv4 + UDP, DLCP's header, the MAC (as the engine counts).
DATAGRAM_OVERHEAD_BYTES = IPV4_UDP_BYTES + HEADER.size + MAC_BYTES
#: Receivers here ACK every 48 KiB (``DlcpParams.ack_every`` 0), where the real link ACKs every 96 KiB
#: (:data:`~commsched.transport.dlcp.protocol.ACK_EVERY_BYTES`): that link halved its ACKs because each one costs
#: a Python host's I/O thread a system call and a wake-up on the core that trains, a cost the fabrics simulated
#: here do not have; their feedback stays at the granularity the simulator's results were validated with.
FABRIC_ACK_EVERY_BYTES = 48 * 1024
_PLAIN = MessageSpec()
_CLASSES = len(LAYER_DSCP)  # layer classes with a DSCP of their own; later ones share the last


def band_of(tos: int, bands: int) -> int:
    """The strict-priority band (0 first) a switch with ``bands`` bands gives a TOS byte.

    The layer classes' DSCPs (:data:`~commsched.transport.dlcp.protocol.LAYER_DSCP`, front layers
    first) take bands ``0 .. bands-2``; everything else, best effort (an unimportant DLCP packet, CS0)
    included, the last band. One band: everything in it.
    """
    if bands <= 1:
        return 0
    dscp = tos >> 2
    if dscp in LAYER_DSCP:
        return min(LAYER_DSCP.index(dscp), bands - 2)
    return bands - 1


class Transfer:
    """One message: its sender's and its receiver's state, and how it ended (``ended_s``, ``ReceiverState``)."""

    __slots__ = ("end", "ended_s", "itemsize", "known", "norms", "phase", "posted_s", "prio", "recv", "send",
                 "step", "stride")  # fmt: skip

    def __init__(self, end: int, numel: int, stride: int, spec: MessageSpec, important: Any, norms: Any,
                 params: Any, now_s: float) -> None:  # fmt: skip
        self.end = end
        self.itemsize = spec.itemsize
        self.stride = stride
        self.prio = spec.priority
        self.phase = spec.phase
        self.step = spec.step
        self.norms = norms
        self.known = spec.norms is not None  # magnitudes from a recorded histogram, not ranks
        self.posted_s = now_s
        self.ended_s = -1.0
        self.send = SenderState(
            numel, stride, important, probe_delay_s=params.probe_delay_s, probe_timeout_s=params.probe_timeout_s
        )
        self.recv = ReceiverState(numel, spec.loss_bound, stop_at_count=params.stop_at_count)

    def lost_norm_fraction(self) -> float:
        """The share of the message's squared chunk norms in the packets that never arrived."""
        norms = np.asarray(self.norms, dtype=np.float64)
        total = float(np.sum(norms * norms))
        if total <= 0:
            return 0.0
        lost = 0.0
        for start, stop in self.recv.missing():
            chunk = norms[start // self.stride : -(-stop // self.stride)]
            lost += float(np.sum(chunk * chunk))
        return lost / total


def _urgency(transfer: Transfer) -> tuple[tuple[int, int, int], int]:
    """Most urgent first: the link's :func:`~commsched.transport.dlcp.protocol.send_order`, then the first
    posted."""
    return send_order(transfer.step, transfer.phase, transfer.prio), transfer.end


def _control(transfer: Transfer | None, act: Action, nbytes: int, now_s: float, *, ack: bool) -> Packet:
    pkt = Packet(0, 0, DATAGRAM_OVERHEAD_BYTES + nbytes, now_s, is_ack=ack, ect=True, cls=0)
    pkt.info = (transfer, act)
    return pkt


class DlcpSender:
    """The sending half of one host pair (module docstring). Counters: ``sent``, ``retransmits`` (datagrams
    re-sent after a BITMAP), ``probes``."""

    def __init__(self, config: PacketConfig, cls: int) -> None:
        p = config.dlcp
        self.p = p
        self.cls = cls
        self.seed = config.seed
        self.bands = config.priority_classes
        self.mtu_bytes = config.tcp.segment_bytes + config.tcp.header_bytes
        gbps = 1e9 / 8
        self.rate = RateControl(
            RateParams(
                initial_rate_bytes_per_s=p.initial_gbps * gbps,
                min_rate_bytes_per_s=p.min_gbps * gbps,
                gain=p.gain,
                alpha_init=p.alpha_init,
                burst_bytes=float(p.burst_bytes),
                feedback_timeout_s=p.feedback_timeout_s,
                ack_slack=p.ack_every or datagrams_per_ack(self.mtu_bytes, FABRIC_ACK_EVERY_BYTES),
            )
        )
        self.transfers: list[Transfer] = []  # posted and not yet stopped, most urgent first (_urgency)
        self.count = 0
        self.timer_s = INF
        self.sent = 0
        self.retransmits = 0
        self.probes = 0
        self.spray = p.spray
        self._acts: list[Action] = []
        #: (ECN-capable, band) of a datagram by ``layer class * 2 + important`` (classes past the last alike)
        self._marking = [
            ((tos & 3) == ECT0, band_of(tos, self.bands))
            for tos in (tos_byte(c, bool(important)) for c in range(_CLASSES) for important in (0, 1))
        ]

    def push(self, nbytes: int, now_s: float, out: list[Packet], spec: MessageSpec | None = None) -> int:
        """Post a message of ``nbytes`` (a send and its receive); its end index is its number, from 1."""
        spec = spec if spec is not None else _PLAIN
        numel = -(-nbytes // spec.itemsize)
        stride = packet_numel(self.mtu_bytes, spec.itemsize, IPV4_UDP_BYTES)
        packets = -(-numel // stride)
        self.count += 1
        if spec.norms is not None:
            norms = spec.norms(stride, numel)
        else:  # magnitudes not known: i.i.d., so the quantile picks a random share (only ranks matter)
            norms = np.random.default_rng((self.seed, self.cls, self.count)).random(packets)
        if spec.loss_bound > 0:
            important = classify(
                norms, spec.priority, self.p.quantile, important_layer_classes=self.p.important_layer_classes
            )
        else:  # the receiver needs every packet: none is to be dropped first
            important = np.ones(packets, dtype=np.uint8)
        transfer = Transfer(self.count, numel, stride, spec, important, norms, self.p, now_s)
        bisect.insort(self.transfers, transfer, key=_urgency)
        self._pump(now_s, out)
        return transfer.end

    # ---- feedback ----

    def on_ack(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        transfer, act = pkt.info
        if type(act) is Ack:
            self.rate.on_ack(act.sent, act.received, act.ce, act.echo, now_s)
        elif type(act) is Stop:
            transfer.send.on_stop()
            if transfer in self.transfers:
                self.transfers.remove(transfer)
        elif type(act) is Bitmap:
            transfer.send.on_bitmap(act.seq, act.holes, act.below, act.allowed)
        self._pump(now_s, out)

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        self.rate.on_timer(now_s)  # gives up on what is in flight when feedback stopped
        self._pump(now_s, out)

    # ---- sending ----

    def _pump(self, now_s: float, out: list[Packet]) -> None:
        """Send what the pacer and window allow, most urgent message first; PROBEs that are due; re-arm.

        Datagrams go in batches of what :meth:`RateControl.allowance` lets through back to back (the same
        datagrams, in the same order, as one :meth:`RateControl.delay_s` check each).
        """
        rate = self.rate
        transfers = self.transfers  # by (layer class, posting order): the most urgent first
        acts = self._acts
        probe_delay_s = max(self.p.probe_delay_s, 2 * rate.srtt_s)  # past the queues the last datagrams wait in
        first, count = 0, len(transfers)
        while True:
            while first < count and not transfers[first].send.pending:
                first += 1
            if first == count:
                break
            budget = rate.allowance(now_s, self.mtu_bytes)
            if budget == 0:
                break
            t = transfers[first]
            t.send.probe_delay_s = probe_delay_s
            acts.clear()
            t.send.next_packets(now_s, budget, acts)
            for act in acts:
                self._emit(t, act, now_s, out)
        wake = INF
        for t in transfers:
            s = t.send
            if not s.pending and not s.done:
                s.probe_delay_s = probe_delay_s
                if s.wake_s <= now_s:
                    acts.clear()
                    s.next_packets(now_s, 0, acts)
                    for act in acts:
                        self._emit(t, act, now_s, out)
                if s.wake_s < wake:
                    wake = s.wake_s
        if first < count:  # datagrams wait for the pacer (or for the window: an Ack or the timer opens it)
            delay = rate.delay_s(now_s)
            if now_s + delay < wake:
                wake = now_s + delay
        self.timer_s = min(wake, rate.timer_s)  # the rate's timer runs while datagrams are in flight

    def _emit(self, transfer: Transfer, act: Action, now_s: float, out: list[Packet]) -> None:
        if type(act) is Data:
            ect, band = self._marking[min(transfer.prio, _CLASSES - 1) * 2 + act.important]
            payload = act.numel * transfer.itemsize
            pkt = Packet(0, payload, payload + DATAGRAM_OVERHEAD_BYTES, now_s, ect=ect, cls=band)
            seq = self.rate.on_send(pkt.size_bytes, now_s)
            pkt.seq = seq
            transfer.send.numbered(act.offset, seq)
            if self.spray:
                pkt.path = seq
            pkt.info = (transfer, act)
            self.sent += 1
            self.retransmits += act.resend
            out.append(pkt)
        elif type(act) is Probe:
            self.probes += 1
            out.append(_control(transfer, act, 0, now_s, ack=False))


class DlcpReceiver:
    """The receiving half of one host pair. ``completed``: end indices of messages whose receive ended
    (the driver completes them). ``records``: per message whose receive ended, in that order,
    ``(numel, lost numel, how it ended, share of the squared norm lost)`` (the last NaN without
    recorded magnitudes)."""

    def __init__(self, config: PacketConfig, cls: int) -> None:
        p = config.dlcp
        every = p.ack_every or datagrams_per_ack(
            config.tcp.segment_bytes + config.tcp.header_bytes, FABRIC_ACK_EVERY_BYTES
        )
        self.feedback = PeerFeedback(every=every, interval_s=p.ack_interval_s)
        self.rcv_nxt = 0  # never advances: messages complete through ``completed``
        self.completed: list[int] = []
        self.records: list[tuple[int, int, str, float]] = []
        self.open: dict[int, Transfer] = {}  # receives under way, by message: a loss reports their holes
        self.timer_s = INF
        self.duplicates = 0
        self.late = 0
        self._acts: list[Action] = []

    def on_data(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        transfer, act = pkt.info
        acts = self._acts
        acts.clear()
        recv = transfer.recv
        was_open = recv.ended is None
        below = None
        if type(act) is Data:
            below = self.feedback.on_data(pkt.seq, pkt.ce, now_s, acts)
            accepted = recv.on_data(act.offset, act.numel, transfer.stride, acts)
            if accepted is Accept.DUPLICATE:
                self.duplicates += 1
            elif accepted is Accept.LATE:
                self.late += 1
        else:  # a PROBE ends a receive whose holes are within the bound (the link's default rule)
            recv.on_probe(act.seq, acts)
        if was_open and recv.ended is None:
            self.open[transfer.end] = transfer
        if was_open and recv.ended is not None:
            self.open.pop(transfer.end, None)
            transfer.ended_s = now_s
            self.completed.append(transfer.end)
            norm_lost = transfer.lost_norm_fraction() if transfer.known else math.nan
            self.records.append((recv.numel, recv.lost, recv.ended or "", norm_lost))
        self._send(transfer, now_s, out)
        if below is not None:  # as the link's Inbound.report: every receive under way reports its holes
            for other in list(self.open.values()):
                acts.clear()
                other.recv.report(below, acts)
                self._send(other, now_s, out)

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        self._acts.clear()
        self.feedback.on_timer(now_s, self._acts)
        self._send(None, now_s, out)

    def _send(self, transfer: Transfer | None, now_s: float, out: list[Packet]) -> None:
        for act in self._acts:
            if type(act) is Ack:
                out.append(_control(None, act, ACK.size, now_s, ack=True))
            elif type(act) is Bitmap:
                out.append(_control(transfer, act, HOLE.size * len(act.holes), now_s, ack=True))
            else:
                out.append(_control(transfer, act, 0, now_s, ack=True))
        self.timer_s = max(self.feedback.timer_s, now_s)  # -inf before the first ACK: due now


def _dlcp(config: PacketConfig, cls: int) -> tuple[Sender, Receiver]:
    return DlcpSender(config, cls), DlcpReceiver(config, cls)


register_transport("dlcp", _dlcp)
