"""DLCP's sender rate control: DCTCP's reaction to congestion (Alizadeh et al., SIGCOMM'10) on a paced rate.

One :class:`RateControl` per destination, clock-free (every method takes
``now_s``), driven by the link and by the packet-level simulator alike. It
never reads the configured link rate: it learns from the receiver's
cumulative :class:`~commsched.transport.dlcp.protocol.Ack` counts and from
round-trip samples. Per round (about one round trip) it estimates DCTCP's
``α`` from marks and confirmed losses; it cuts at once on a mark or a loss
(``rate·(1 − α/2)``; halving for a loss on a path that never marked once
its losses exceed ``loss_tolerance``), at most once per round trip; it
tells loss from reordering with a RACK-style window and undoes a cut that
reordering caused; it grows after a clean round (doubling
in slow start, one datagram per round trip after); a window of twice rate
times round trip keeps it self-clocked; a feedback timeout gives up on what
is in flight; the rate stays between a floor and ``max_rate_bytes_per_s``,
paced by a token bucket. The full rules, with their sources, are in
docs/dlcp.md, "Rate control".
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from commsched.transport.dlcp.rate_params import RateParams
from commsched.transport.dlcp.wire import NO_ECHO, NO_SAMPLE, U32

__all__ = ["RateControl", "RateParams"]

#: Send times are kept for round-trip samples in a ring that starts at _RING_START datagrams and doubles while
#: more than half of it is in flight, up to _RING_MAX (a sender that sends little holds little: a simulation
#: keeps tens of thousands of them).
_RING_START, _RING_MAX = 64, 4096
_DELIVERY_ROUNDS = 10  # rounds the delivery-rate filter remembers (BBR's)
_HALF = 2**31
#: The cut for a datagram this host refused (a full send buffer: at least ~200 KB queued here, 5 ms at 300 Mbit/s):
#: halving, as for a loss on a path that overflows. Against a cut by α on the testbed (300 Mbit/s, 9000-byte frames,
#: 105 steps of the cnn, one run each) both gave 100 ms per step; halving saw 2 refusals over both ranks, α 36.
REFUSED_CUT = 1.0


def _grown(ring: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The send-time ring at twice the size, each entry at its sequence number's new place."""
    out = [(-1, 0.0)] * (2 * len(ring))
    for entry in ring:
        if entry[0] >= 0:
            out[entry[0] % len(out)] = entry
    return out


def _after(a: int, b: int) -> bool:
    """Sequence number ``a`` is ``b`` or later (32-bit serial arithmetic)."""
    return (a - b) % U32 < _HALF


class RateControl:
    """The allowed sending rate toward one destination (bytes/s), from feedback events and ``now_s``.

    Counters: ``decreases`` (cuts), ``undone`` (cuts undone), ``timeouts``, ``rounds``, ``lost``
    (datagrams confirmed lost, net of those found reordered), ``refused``
    (numbered, then refused by this host: :meth:`on_unsent`), ``reordered``
    (times datagrams counted lost arrived after all); ``marking_path``: a
    CE mark came back from this destination.
    """

    __slots__ = (
        "_acked", "_avg_bytes", "_backoff", "_cut_in_round", "_delivered", "_delivered_max", "_feedback_s",
        "_highest", "_missing_since", "_numbered", "_recover_seq", "_reo_mult", "_reo_round", "_round_ce",
        "_round_lost", "_round_received", "_round_sent_bytes", "_round_seq", "_round_start_s", "_sent_at",
        "_sent_since_feedback", "_skipped", "_stamp_s", "_tokens", "_undo_lost", "_undo_rate", "_unsent",
        "_window_limited", "alpha", "decreases", "lost", "marking_path", "min_rtt_s", "p", "rate_bytes_per_s",
        "refused", "reordered", "rounds", "rttvar_s", "seq", "slow_start", "srtt_s", "timeouts", "undone",
    )  # fmt: skip

    def __init__(self, params: RateParams | None = None, now_s: float = 0.0) -> None:
        self.p = params if params is not None else RateParams()
        self.rate_bytes_per_s = min(self.p.max_rate_bytes_per_s, self.p.initial_rate_bytes_per_s)
        self.alpha = self.p.alpha_init
        self.slow_start = True
        self.marking_path = False
        self.decreases = 0
        self.timeouts = 0
        self.rounds = 0
        self.lost = 0
        self.refused = 0
        self.reordered = 0
        self.seq = 0  # the next datagram's sequence number
        self._numbered = 0  # datagrams numbered so far (the receiver's unwrapped count of ``sent``)
        self._unsent: list[int] = []  # heap: unwrapped numbers of datagrams that never left, not yet acked past
        self._skipped = 0  # datagrams that never left, below the last Ack's ``sent``
        self.srtt_s = 0.0
        self.rttvar_s = 0.0
        self.min_rtt_s = 0.0
        self._highest = U32 - 1  # the highest sequence number the receiver has seen (none yet)
        self._avg_bytes = 0.0
        self._recover_seq = 0
        self._tokens = self.p.burst_bytes
        self._stamp_s = now_s
        self._feedback_s = now_s
        self._sent_since_feedback = False
        self._backoff = 0  # feedback timeouts in a row
        self._sent_at: list[tuple[int, float]] = [(-1, 0.0)] * _RING_START
        self._acked = (0, 0, 0)  # cumulative (sent, received, ce) of the last Ack
        #: ``(since_s, m, h)``, each increasing: ``missing ≥ m`` has held since ``since_s``, and then those
        #: ``m`` datagrams were all numbered below ``h``
        self._missing_since: deque[tuple[float, int, int]] = deque()
        self._reo_mult = 1
        self._undo_rate = 0.0  # the rate before the last cut, while that cut answered losses only
        self._undo_lost = 0  # the losses confirmed before them
        self.undone = 0
        self._reo_round = -1  # the round the window last widened in
        self._round_seq = 0
        self._round_start_s = now_s
        self._round_sent_bytes = 0.0
        self._round_received = 0
        self._round_ce = 0
        self._round_lost = 0
        self._cut_in_round = False
        self._window_limited = False
        self._delivered = [0.0] * _DELIVERY_ROUNDS  # delivery rate of recent rounds (bytes/s)
        self._delivered_max = 0.0

    # ---- pacing ----

    def _refill(self, now_s: float) -> None:
        if now_s > self._stamp_s:
            self._tokens = min(self.p.burst_bytes, self._tokens + self.rate_bytes_per_s * (now_s - self._stamp_s))
            self._stamp_s = now_s

    @property
    def delivery_bytes_per_s(self) -> float:
        """The best delivery rate of the last rounds (BBR's bandwidth filter; 0 before any round)."""
        return self._delivered_max

    @property
    def inflight(self) -> int:
        """Datagrams sent after the highest one the receiver has seen."""
        return (self.seq - self._highest - 1) % U32

    @property
    def window(self) -> float:
        """The most datagrams in flight (before any round trip was measured: the initial window)."""
        if self.min_rtt_s == 0:
            return max(self.p.initial_window, self.p.ack_slack)
        rate = self.rate_bytes_per_s
        if self.slow_start and 0 < 2 * self._delivered_max < rate:
            rate = 2 * self._delivered_max  # slow start grows what is in flight as TCP's does: 2x per round
        return 2 * rate * max(self.min_rtt_s, self.p.rtt_floor_s) / self._avg_bytes + self.p.ack_slack

    def delay_s(self, now_s: float) -> float:
        """How long until a datagram may go: 0 now, INF while the window is full (an Ack or a timer opens it)."""
        if self.inflight >= self.window:
            self._window_limited = True
            return math.inf
        self._refill(now_s)
        return 0.0 if self._tokens > 0 else -self._tokens / self.rate_bytes_per_s + 1e-6

    def allowance(self, now_s: float, nbytes: float) -> int:
        """How many datagrams of ``nbytes`` may go now, back to back: as many as :meth:`delay_s` would let
        through one by one, each followed by :meth:`on_send` (fewer if the datagrams are smaller)."""
        window = self.window
        if window != math.inf:
            room = math.ceil(window - self.inflight)
            if room <= 0:
                self._window_limited = True
                return 0
        self._refill(now_s)
        if self._tokens <= 0:
            return 0
        by_tokens = math.ceil(self._tokens / nbytes)
        return by_tokens if window == math.inf else min(room, by_tokens)

    def on_send(self, nbytes: int, now_s: float) -> int:
        """A datagram of ``nbytes`` (on the wire) goes out now; returns its sequence number (32 bits, from 0)."""
        self._refill(now_s)
        self._tokens -= nbytes
        self._round_sent_bytes += nbytes
        if self.inflight == 0:
            self._feedback_s = now_s  # the timer starts with the first datagram in flight (RFC 6298, 5.1)
        self._sent_since_feedback = True
        self._avg_bytes = nbytes if not self._avg_bytes else 0.9 * self._avg_bytes + 0.1 * nbytes
        seq = self.seq
        ring = self._sent_at
        if 2 * self.inflight > len(ring) and len(ring) < _RING_MAX:
            ring = self._sent_at = _grown(ring)
        ring[seq % len(ring)] = (seq, now_s)
        self.seq = (seq + 1) % U32
        self._numbered += 1
        return seq

    def on_unsent(self, seq: int, now_s: float) -> None:
        """Datagram ``seq``, numbered by :meth:`on_send`, never left: the host refused it (a full send buffer).

        The gap it leaves in the numbers the receiver sees is not counted lost
        (it is sent again under a new number), but the refusal is congestion:
        this host's own queue holds a send buffer's worth. It is answered as
        Linux TCP answers a local drop (``tcp_enter_cwr``), at once and at most
        once per round trip: counted in α as a mark is, a cut by
        :data:`REFUSED_CUT`. Counted in ``refused``.
        """
        heapq.heappush(self._unsent, self._numbered - 1 - (self.seq - 1 - seq) % U32)
        self.refused += 1
        self._round_ce += 1
        if _after(seq, self._recover_seq):
            self._cut(REFUSED_CUT, now_s)

    # ---- feedback ----

    def on_ack(self, sent: int, received: int, ce: int, echo: int, now_s: float) -> None:
        """The receiver's cumulative counts (an Ack); out-of-date or repeated counts are ignored."""
        last_sent, last_received, last_ce = self._acked
        if echo == NO_SAMPLE:
            pass  # a repeated Ack: how late it comes is the receiver's timer, not the path
        elif echo != NO_ECHO:
            self._sample(echo, now_s)
        elif sent > last_sent:  # a timer's Ack: the newest datagram it reports arrived since the last Ack
            self._sample((sent - 1) % U32, now_s)
        if sent < last_sent or received < last_received or ce < last_ce:
            return  # out of date
        if sent == last_sent and received == last_received:
            return  # repeated
        self._acked = (sent, received, ce)
        unsent = self._unsent
        while unsent and unsent[0] < sent:
            heapq.heappop(unsent)
            self._skipped += 1
        self._round_received += received - last_received
        marked = ce - last_ce
        self._round_ce += marked
        if marked:
            self.marking_path = True
        top = (sent - 1) % U32
        if _after(top, self._highest) and _after(self.seq, sent % U32):
            self._highest = top
        self._feedback_s = now_s
        self._sent_since_feedback = False
        self._backoff = 0
        lost_before = self.lost
        lost_below = self._confirm_losses(sent - received - self._skipped, sent % U32, now_s)
        if marked and _after(top, self._recover_seq):
            self._cut(self.alpha, now_s)
        elif lost_below >= 0 and _after((lost_below - 1) % U32, self._recover_seq):
            undo_rate = self.rate_bytes_per_s
            overflow = not self.marking_path and self.alpha > self.p.loss_tolerance
            self._cut(1.0 if overflow else self.alpha, now_s)
            self._undo_rate, self._undo_lost = undo_rate, lost_before
        if _after(top, self._round_seq):
            self._end_round(now_s)

    def _sample(self, seq: int, now_s: float) -> None:
        """A round-trip sample from datagram ``seq`` (RFC 6298's smoothing)."""
        ring = self._sent_at
        sent_seq, sent_s = ring[seq % len(ring)]
        if sent_seq != seq:
            return
        sample_s = now_s - sent_s
        if self.srtt_s == 0:
            self.srtt_s, self.rttvar_s = sample_s, sample_s / 2
        else:
            self.rttvar_s = 0.75 * self.rttvar_s + 0.25 * abs(self.srtt_s - sample_s)
            self.srtt_s = 0.875 * self.srtt_s + 0.125 * sample_s
        self.min_rtt_s = sample_s if self.min_rtt_s == 0 else min(self.min_rtt_s, sample_s)

    @property
    def reorder_window_s(self) -> float:
        """RACK's ``reo_wnd``: how long a datagram must stay missing to count as lost (INF before any sample)."""
        if self.min_rtt_s == 0:
            return math.inf
        return min(self._reo_mult * self.min_rtt_s / 4, self.srtt_s)

    def _confirm_losses(self, missing: int, sent: int, now_s: float) -> int:
        """Count as lost what has stayed missing for the reordering window (module docstring).

        Returns -1, or when losses were confirmed now, a sequence number they all lie below.
        """
        since = self._missing_since
        if missing < self.lost:  # datagrams counted lost arrived: reordered, not lost
            self.reordered += 1
            self._round_lost = max(0, self._round_lost - (self.lost - missing))
            self.lost = missing
            if self.rounds > self._reo_round:  # RACK widens its window at most once per round trip
                self._reo_round = self.rounds
                self._reo_mult += 1
            if self._undo_rate > 0 and missing <= self._undo_lost:  # every loss the last cut answered arrived
                self.undone += 1
                self._set(max(self.rate_bytes_per_s, self._undo_rate), now_s)
                self._undo_rate = 0.0
        start_s, below = now_s, sent
        while since and since[-1][1] >= missing:
            start_s, _, below = since.pop()  # missing ≥ this value held since then too
        since.append((start_s, missing, below))
        horizon_s = now_s - self.reorder_window_s
        while len(since) > 1 and since[1][0] <= horizon_s:
            since.popleft()
        held_s, held, held_below = since[0]
        if held_s > horizon_s or held <= self.lost:
            return -1
        self._round_lost += held - self.lost
        self.lost = held
        return held_below

    def _end_round(self, now_s: float) -> None:
        """The receiver saw the round's first datagram: learn α from the round; increase after a clean one."""
        self.rounds += 1
        ce, received, lost = self._round_ce, self._round_received, self._round_lost
        if received + lost:
            self.alpha = (1 - self.p.gain) * self.alpha + self.p.gain * (ce + lost) / (received + lost)
        elapsed_s = now_s - self._round_start_s
        rate = self.rate_bytes_per_s
        app_limited = self._round_sent_bytes < 0.5 * rate * elapsed_s
        if elapsed_s > 0:
            self._record_delivery(received * self._avg_bytes / elapsed_s, app_limited)
        untested = self._window_limited or app_limited
        if received and not (ce or lost or self._cut_in_round or untested):
            round_trip_s = self.srtt_s if self.srtt_s > 0 else elapsed_s
            self._set(2 * rate if self.slow_start else rate + self._avg_bytes / max(round_trip_s, 1e-9), now_s)
        self._start_round(now_s)

    def _record_delivery(self, bytes_per_s: float, app_limited: bool) -> None:
        """Keep the best delivery rate of the last ``_DELIVERY_ROUNDS`` rounds (BBR's bandwidth filter: a round
        the application limited counts only if it delivered more than the best)."""
        if app_limited and bytes_per_s <= self._delivered_max:
            return
        ring = self._delivered
        ring[self.rounds % _DELIVERY_ROUNDS] = bytes_per_s
        self._delivered_max = max(ring)

    def _start_round(self, now_s: float) -> None:
        self._round_seq = self.seq
        self._round_start_s = now_s
        self._round_sent_bytes = 0.0
        self._round_received = self._round_ce = self._round_lost = 0
        self._cut_in_round = self._window_limited = False

    def _cut(self, fraction: float, now_s: float) -> None:
        """``rate ← rate·(1 − fraction/2)``; leave slow start; no cut again before the recovery point."""
        self._undo_rate = 0.0  # a cut for a loss sets it again
        self.slow_start = False
        self._recover_seq = self.seq
        self._cut_in_round = True
        self._set(self.rate_bytes_per_s * (1 - min(1.0, fraction) / 2), now_s)

    @property
    def timeout_s(self) -> float:
        """The feedback timeout now: ``max(feedback_timeout_s, srtt + 4·rttvar)``, doubled per timeout in a row."""
        return max(self.p.feedback_timeout_s, self.srtt_s + 4 * self.rttvar_s) * (1 << min(self._backoff, 16))

    @property
    def timer_s(self) -> float:
        """When :meth:`on_timer` would give up on what is in flight (INF: nothing is)."""
        return self._feedback_s + self.timeout_s if self.inflight else math.inf

    def on_timer(self, now_s: float) -> None:
        """At ``timer_s``: give up on what is in flight; halve the rate if it was sent after the last feedback."""
        if not self.inflight or now_s < self._feedback_s + self.timeout_s:  # as timer_s says
            return
        self.timeouts += 1
        self._highest = (self.seq - 1) % U32  # give up on what is in flight: the window reopens
        if self._sent_since_feedback:  # sending on into silence: back off, once per timeout period
            self._backoff += 1
            self._cut(1.0, now_s)
        self._sent_since_feedback = False
        self._feedback_s = now_s
        self._start_round(now_s)

    def _set(self, rate: float, now_s: float) -> None:
        self._refill(now_s)
        if rate < self.rate_bytes_per_s:
            self.decreases += 1
        self.rate_bytes_per_s = min(self.p.max_rate_bytes_per_s, max(self.floor_bytes_per_s, rate))

    @property
    def floor_bytes_per_s(self) -> float:
        """The least rate: two datagrams per smoothed round trip (TCP's least window), at least ``min_rate``."""
        if self.srtt_s > 0 and self._avg_bytes > 0:
            return max(self.p.min_rate_bytes_per_s, 2 * self._avg_bytes / self.srtt_s)
        return self.p.min_rate_bytes_per_s
