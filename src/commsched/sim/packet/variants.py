"""NewReno's datacenter variants: DCTCP's ECN-scaled window cut and pFabric's priority end host.

Both are :class:`~commsched.sim.packet.newreno.TcpSender` subclasses that
change window growth and what packets carry; both use NewReno's
:class:`~commsched.sim.packet.newreno.TcpReceiver` (ECN-capable ACKs for DCTCP).
"""

from __future__ import annotations

from commsched.sim.packet.config import TcpParams
from commsched.sim.packet.fabric import Packet
from commsched.sim.packet.newreno import TcpSender

# ---- DCTCP ----


class DctcpSender(TcpSender):
    """DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257): data is ECN-capable; α, the EWMA (gain ``g``)
    of the fraction of acked segments that were marked, is updated once per window; on the first ECE of
    a window the window is cut to ``cwnd · (1 - α/2)`` and does not grow until that window is acked
    (CWR). Loss is handled as in NewReno."""

    ect = True

    def __init__(self, params: TcpParams, cls: int = 0) -> None:
        super().__init__(params, cls)
        self.alpha = params.dctcp_alpha_init
        self._acked = 0
        self._marked = 0
        self._window_end = 0
        self._cwr_end = -1

    def _on_ecn(self, pkt: Packet, newly: int, now_s: float) -> None:
        counted = newly if newly else 1
        self._acked += counted
        if pkt.ece:
            self._marked += counted
        if self.una > self._window_end:
            g = self.p.dctcp_g
            self.alpha = (1 - g) * self.alpha + g * (self._marked / self._acked if self._acked else 0.0)
            self._acked = self._marked = 0
            self._window_end = self.nxt
        if pkt.ece and self.una > self._cwr_end and not self.in_recovery:
            self.cwnd = max(self.cwnd * (1 - self.alpha / 2), 1.0)
            self.ssthresh = self.cwnd
            self._cwr_end = self.nxt

    def _on_new_ack(self, newly: int) -> None:
        if self.una > self._cwr_end:  # no growth for the window after a cut (CWR)
            super()._on_new_ack(newly)


# ---- pFabric ----


class PfabricSender(TcpSender):
    """pFabric's end host (Alizadeh et al., SIGCOMM 2013): each packet carries its message's remaining
    bytes as priority (smaller first, at pFabric switch ports); a fixed window of about one BDP
    (``pfabric_window_segments``), no window cut on duplicate ACKs (just the retransmission), a small
    fixed timeout (``pfabric_rto_s``) after which the window restarts from one segment in slow start."""

    def __init__(self, params: TcpParams, cls: int = 0) -> None:
        super().__init__(params, cls)
        self.cwnd = float(params.pfabric_window_segments)
        self.rto = params.pfabric_rto_s

    def _prio(self, seq: int) -> float:
        for end in self.ends:
            if seq < end:
                return float((end - seq) * self.mss)
        return 0.0

    def _rtt_sample(self, rtt_s: float) -> None:
        self.rto = self.p.pfabric_rto_s

    def _on_new_ack(self, newly: int) -> None:
        cap = float(self.p.pfabric_window_segments)
        if self.cwnd < cap:
            self.cwnd = min(cap, self.cwnd + 1)

    def _enter_recovery(self, now_s: float, out: list[Packet]) -> None:
        out.append(self._segment(self.una, now_s))
        self.retransmits += 1
        self.recoveries += 1

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        super().on_timer(now_s, out)
        self.rto = self.p.pfabric_rto_s
