"""TCP NewReno as a clock-free sender and receiver: the ``tcp`` transport, and the base of DCTCP's and pFabric's.

:class:`TcpSender` and :class:`TcpReceiver` implement the
:class:`~commsched.sim.packet.transport.Sender` and
:class:`~commsched.sim.packet.transport.Receiver` protocols over segments of
``TcpParams.segment_bytes``; windows count segments, times are in seconds.
"""

from __future__ import annotations

import math

from commsched.sim.packet.config import TcpParams
from commsched.sim.packet.fabric import Packet
from commsched.sim.packet.transport import MessageSpec

INF = math.inf


class TcpSender:
    """TCP NewReno (RFC 6582) over segments: slow start, congestion avoidance, fast retransmit and
    recovery with partial ACKs (only the first of which restarts the retransmission timer, as
    RFC 6582 says), RTO with exponential backoff and go-back-N.

    Windows count segments. Slow start adds one segment per ACK of new data,
    congestion avoidance ``1/cwnd`` (as ns-3's NewReno without ABC). RTT
    samples come from the timestamp echoed by each ACK that advances ``una``
    (RFC 7323's RTTM rule; duplicate ACKs give none). On a timeout
    ``ssthresh = max(flight/2, 2)``, held constant on further timeouts until
    ``una`` advances (RFC 5681). Subclasses change
    :meth:`_on_new_ack` (window growth) and mark packets (``ect``, ``prio``).
    """

    ect = False

    def __init__(self, params: TcpParams, cls: int = 0) -> None:
        self.p = params
        self.cls = cls
        self.mss = params.segment_bytes
        self.hdr = params.header_bytes
        self.cwnd = float(params.initial_window_segments)
        self.ssthresh = INF
        self.una = 0
        self.nxt = 0
        self.end = 0
        self.high = 0  # highest segment sent + 1
        self.partial: dict[int, int] = {}  # last segment of a message -> its payload bytes
        self.ends: list[int] = []  # message ends, in segments (for pFabric's remaining size)
        self.dupacks = 0
        self.recover = -1
        self.in_recovery = False
        self._first_partial = False
        self._timer_retransmitted = False  # the head was resent by the timer since una last advanced
        self.srtt = -1.0
        self.rttvar = 0.0
        self.rto = params.initial_rto_s
        self.timer_s = INF
        self.established = not params.handshake
        self.syn_sent = False
        self.retransmits = 0
        self.timeouts = 0
        self.recoveries = 0

    # ---- the stream ----

    def push(self, nbytes: int, now_s: float, out: list[Packet], spec: MessageSpec | None = None) -> int:
        full, rest = divmod(nbytes, self.mss)
        self.end += full
        if rest:
            self.partial[self.end] = rest
            self.end += 1
        self.ends.append(self.end)
        if not self.established:
            if not self.syn_sent:
                self.syn_sent = True
                out.append(Packet(-1, 0, self.hdr, now_s, syn=True, ect=self.ect, cls=self.cls))
                self.timer_s = now_s + self.rto
            return self.end
        self._send(now_s, out)
        return self.end

    def _segment(self, seq: int, now_s: float) -> Packet:
        payload = self.partial.get(seq, self.mss)
        return Packet(seq, payload, payload + self.hdr, now_s, ect=self.ect, cls=self.cls, prio=self._prio(seq))

    def _prio(self, seq: int) -> float:
        return 0.0

    def _send(self, now_s: float, out: list[Packet]) -> None:
        limit = self.una + int(self.cwnd)
        if self.dupacks and not self.in_recovery and self.p.limited_transmit:
            limit += min(self.dupacks, self.p.dupack_threshold - 1)  # RFC 3042
        if limit < self.una + 1:
            limit = self.una + 1
        while self.nxt < self.end and self.nxt < limit:
            out.append(self._segment(self.nxt, now_s))
            self.nxt += 1
        if self.nxt > self.high:
            self.high = self.nxt
        if self.timer_s == INF and self.una < self.nxt:
            self.timer_s = now_s + self.rto

    # ---- ACKs ----

    def _rtt_sample(self, rtt_s: float) -> None:
        if self.srtt < 0:
            self.srtt, self.rttvar = rtt_s, rtt_s / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt_s)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt_s
        p = self.p
        self.rto = min(p.max_rto_s, max(p.min_rto_s, self.srtt + max(p.clock_granularity_s, 4 * self.rttvar)))

    def on_ack(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        if pkt.syn:  # SYN-ACK
            if not self.established:
                self.established = True
                self._rtt_sample(now_s - pkt.ts_echo)
                self.timer_s = INF
                self._send(now_s, out)
            return
        ack = pkt.ack
        if ack > self.una:
            self._rtt_sample(now_s - pkt.ts_echo)  # RFC 7323's RTTM rule: only ACKs that advance una
            newly = ack - self.una
            self.una = ack
            self._timer_retransmitted = False
            if self.nxt < ack:
                self.nxt = ack
            self.dupacks = 0
            self._on_ecn(pkt, newly, now_s)
            restart = True
            if self.in_recovery:
                if ack > self.recover:
                    self.in_recovery = False
                    self.cwnd = self.ssthresh
                else:  # partial ACK: retransmit the next hole, deflate by what was acked
                    out.append(self._segment(ack, now_s))
                    self.retransmits += 1
                    self.cwnd = max(self.cwnd - newly + 1, 1.0)
                    restart = self._first_partial  # RFC 6582: only the first partial ACK restarts the timer
                    self._first_partial = False
            else:
                self._on_new_ack(newly)
            if restart:
                self.timer_s = now_s + self.rto if self.una < self.nxt else INF
        elif ack == self.una and self.una < self.nxt:
            self._on_ecn(pkt, 0, now_s)
            self.dupacks += 1
            if self.in_recovery:
                self.cwnd += 1
            elif self.dupacks == self.p.dupack_threshold and ack > self.recover:
                self._enter_recovery(now_s, out)
        self._send(now_s, out)

    def _enter_recovery(self, now_s: float, out: list[Packet]) -> None:
        self.ssthresh = max((self.nxt - self.una) / 2, 2.0)
        self.recover = self.nxt - 1
        self.in_recovery = True
        self._first_partial = True
        self.cwnd = self.ssthresh + self.p.dupack_threshold
        out.append(self._segment(self.una, now_s))
        self.retransmits += 1
        self.recoveries += 1

    def _on_new_ack(self, newly: int) -> None:
        if self.cwnd < self.ssthresh:
            self.cwnd += 1
        else:
            self.cwnd += 1 / self.cwnd

    def _on_ecn(self, pkt: Packet, newly: int, now_s: float) -> None:
        pass

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        if now_s < self.timer_s:
            return
        if not self.established:
            self.rto = min(self.rto * 2, self.p.max_rto_s)
            out.append(Packet(-1, 0, self.hdr, now_s, syn=True, ect=self.ect, cls=self.cls))
            self.timer_s = now_s + self.rto
            return
        if self.una >= self.nxt:
            self.timer_s = INF
            return
        self.timeouts += 1
        if not self._timer_retransmitted:  # RFC 5681: held constant when the timer resends the head again
            self.ssthresh = max((self.nxt - self.una) / 2, 2.0)
            self._timer_retransmitted = True
        self.cwnd = 1.0
        self.recover = self.high - 1
        self.in_recovery = False
        self.dupacks = 0
        self.nxt = self.una  # go back N
        self.rto = min(self.rto * 2, self.p.max_rto_s)
        self.timer_s = INF
        self.retransmits += 1
        self._send(now_s, out)


class TcpReceiver:
    """Cumulative ACKs, out-of-order segments buffered; ACK every ``delayed_ack_segments`` in-order
    segments (at once for out-of-order or duplicate data, and for a CE change), each echoing the
    timestamp of the segment that triggered it and its CE mark (ECE, per packet as DCTCP wants).
    ``ect``: ACKs are ECN-capable too (DCTCP in Linux and ns-3), so an AQM marks rather than drops them.
    """

    def __init__(self, params: TcpParams, cls: int = 0, *, ect: bool = False) -> None:
        self.p = params
        self.cls = cls
        self.ect = ect
        self.hdr = params.header_bytes
        self.rcv_nxt = 0
        self.completed: list[int] = []  # never used: messages complete in order
        self.ooo: set[int] = set()
        self.timer_s = INF
        self._unacked = 0
        self._last_ts = 0.0
        self._last_ce = False

    def _ack(self, now_s: float, out: list[Packet]) -> None:
        out.append(
            Packet(
                0,
                0,
                self.hdr,
                now_s,
                is_ack=True,
                ack=self.rcv_nxt,
                ts_echo=self._last_ts,
                ece=self._last_ce,
                ect=self.ect,
                cls=self.cls,
            )
        )
        self._unacked = 0
        self.timer_s = INF

    def on_data(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        if pkt.syn:
            out.append(
                Packet(-1, 0, self.hdr, now_s, is_ack=True, syn=True, ts_echo=pkt.ts, ect=self.ect, cls=self.cls)
            )
            return
        seq = pkt.seq
        in_order = seq == self.rcv_nxt and not self.ooo
        if seq == self.rcv_nxt:
            self.rcv_nxt += 1
            ooo = self.ooo
            while self.rcv_nxt in ooo:
                ooo.discard(self.rcv_nxt)
                self.rcv_nxt += 1
        elif seq > self.rcv_nxt:
            self.ooo.add(seq)
        ce_changed = pkt.ce != self._last_ce
        if ce_changed and self._unacked:  # DCTCP: ACK what came before with the old CE state first
            self._ack(now_s, out)
        self._last_ts = pkt.ts
        self._last_ce = pkt.ce
        self._unacked += 1
        if not in_order or self._unacked >= self.p.delayed_ack_segments:
            self._ack(now_s, out)
        elif self.timer_s == INF:
            self.timer_s = now_s + self.p.delayed_ack_timeout_s

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        if now_s >= self.timer_s and self._unacked:
            self._ack(now_s, out)
