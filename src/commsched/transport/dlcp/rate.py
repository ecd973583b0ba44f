"""DLCP's sender rate control: DCTCP's ECN estimate on a paced rate (as DCQCN does), clock-free.

One :class:`RateControl` per destination. It never reads the configured link
rate: it starts at ``initial_rate_bytes_per_s`` and learns from the
receiver's :class:`~commsched.transport.dlcp.protocol.Ack` feedback, which
counts DATA datagrams sent (by sequence number), received and CE-marked.

Decrease, at once, on a *fresh* signal: an Ack that reports CE marks or
losses among datagrams sent after the last cut (the recovery point, as in
TCP: one cut per round of data, never two for the same congestion). With
``F = (ce + lost) / (received + lost)`` since the last change:

- DCTCP's estimate ``α ← (1 − g)·α + g·F``; ``target ← rate``;
- CE marks only: ``rate ← rate · (1 − α/2)`` (DCTCP's cut);
- losses: the same with ``max(α, F)`` for ``α``: a queue that overflows (F
  large) is cut at once, up to half, while a rare random loss (a gray link,
  F small) costs little — a bounded-loss transport tolerates it anyway.

Increase, once per period ``max(interval_s, srtt)`` in which datagrams were
delivered and nothing was marked or lost: before the first signal (slow
start) the rate doubles; after it, DCQCN's recovery ``rate ← (rate +
target)/2``, from the sixth clean period on with ``target +=
increase_bytes_per_s`` first. An application-limited sender (it used less
than half its allowance) holds its rate instead. ``srtt`` is smoothed (gain
1/8) from Acks that echo a datagram's sequence number, so it includes
queueing delay.

A window caps what is in flight, as BBR caps it at twice the path's
bandwidth-delay product: datagrams sent after the highest one the receiver
has seen may number at most ``2 · rate · max(min_rtt, rtt_floor_s) /
datagram + ack_slack``
(``ack_slack``: the datagrams a receiver may hold before it acknowledges).
A rate alone keeps sending into a standing queue until feedback catches up;
the window makes the sender self-clocked, so a queue stays bounded with or
without ECN. If no feedback arrives for ``feedback_timeout_s`` while
sending, what is in flight is given up on and the rate halves (everything
is being lost: back off rather than keep flooding). The rate stays within
``[min_rate_bytes_per_s, max_rate_bytes_per_s]``.

Pacing is a token bucket of ``burst_bytes``: a packet may go while the
bucket is positive (:meth:`RateControl.delay_s` is 0) and its bytes are
taken when it goes (:meth:`RateControl.on_send`, which also numbers the
datagrams toward this destination). Re-sends pay like first sends, so
retransmissions never add load beyond the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commsched.transport.dlcp.wire import NO_ECHO, U32

_RING = 4096  # send times kept for round-trip samples


@dataclass(frozen=True, slots=True)
class RateParams:
    """Knobs of :class:`RateControl`; defaults suit a host whose loop wakes every ~0.1-1 ms.

    ``ack_slack`` is at least the receivers' :class:`~commsched.transport.dlcp.protocol.PeerFeedback` ``every``.
    ``rtt_floor_s``: the least round trip the window assumes, for receivers
    whose answer time varies well above the fastest one measured (a Python
    receiver loop: about a millisecond).
    """

    initial_rate_bytes_per_s: float = 12.5e6
    min_rate_bytes_per_s: float = 1e6
    max_rate_bytes_per_s: float = float("inf")
    increase_bytes_per_s: float = 10e6
    gain: float = 1 / 16
    interval_s: float = 0.002
    burst_bytes: float = 8 * 1024
    feedback_timeout_s: float = 0.05
    ack_slack: int = 32
    rtt_floor_s: float = 0.0


def _after(a: int, b: int) -> bool:
    """Sequence number ``a`` is ``b`` or later (32-bit serial arithmetic)."""
    return (a - b) % U32 < 2**31


class RateControl:
    """The allowed sending rate toward one destination (bytes/s), from feedback events and ``now_s``."""

    __slots__ = (
        "_acked", "_avg_bytes", "_ce", "_changed_s", "_clean", "_feedback_s", "_highest", "_lost",
        "_received", "_recover_seq", "_sent_at", "_sent_since_feedback", "_stamp_s", "_tokens", "_used_bytes",
        "alpha", "decreases", "min_rtt_s", "p", "rate_bytes_per_s", "seq", "slow_start", "srtt_s",
        "target_bytes_per_s",
    )  # fmt: skip

    def __init__(self, params: RateParams | None = None, now_s: float = 0.0) -> None:
        self.p = params if params is not None else RateParams()
        self.rate_bytes_per_s = self.p.initial_rate_bytes_per_s
        self.target_bytes_per_s = self.rate_bytes_per_s
        self.alpha = 0.0
        self.slow_start = True
        self.decreases = 0
        self.seq = 0  # the next datagram's sequence number
        self.srtt_s = 0.0
        self.min_rtt_s = 0.0
        self._highest = U32 - 1  # the highest sequence number the receiver has seen (none yet)
        self._avg_bytes = 0.0
        self._recover_seq = 0
        self._clean = 0  # clean periods since the last cut
        self._tokens = self.p.burst_bytes
        self._stamp_s = self._changed_s = self._feedback_s = now_s
        self._used_bytes = 0.0
        self._sent_since_feedback = False
        self._sent_at: list[tuple[int, float]] = [(-1, 0.0)] * _RING
        self._acked = (0, 0, 0)  # cumulative (sent, received, ce) of the last Ack
        self._ce = self._lost = self._received = 0  # since the last change

    # ---- pacing ----

    def _refill(self, now_s: float) -> None:
        if now_s > self._stamp_s:
            self._tokens = min(self.p.burst_bytes, self._tokens + self.rate_bytes_per_s * (now_s - self._stamp_s))
            self._stamp_s = now_s

    @property
    def inflight(self) -> int:
        """Datagrams sent after the highest one the receiver has seen."""
        return (self.seq - self._highest - 1) % U32

    @property
    def window(self) -> float:
        """The most datagrams in flight (INF until a round trip was measured)."""
        if self.min_rtt_s == 0:
            return math.inf
        return 2 * self.rate_bytes_per_s * max(self.min_rtt_s, self.p.rtt_floor_s) / self._avg_bytes + self.p.ack_slack

    def delay_s(self, now_s: float) -> float:
        """How long until a packet may go: 0 now, INF while the window is full (an Ack or a timer opens it)."""
        if self.inflight >= self.window:
            return math.inf
        self._refill(now_s)
        return 0.0 if self._tokens > 0 else -self._tokens / self.rate_bytes_per_s + 1e-6

    def on_send(self, nbytes: int, now_s: float) -> int:
        """A datagram of ``nbytes`` (on the wire) goes out now; returns its sequence number (32 bits, from 0)."""
        self._refill(now_s)
        self._tokens -= nbytes
        self._used_bytes += nbytes
        self._sent_since_feedback = True
        self._avg_bytes = nbytes if not self._avg_bytes else 0.9 * self._avg_bytes + 0.1 * nbytes
        seq = self.seq
        self._sent_at[seq % _RING] = (seq, now_s)
        self.seq = (seq + 1) % U32
        return seq

    # ---- feedback ----

    def on_ack(self, sent: int, received: int, ce: int, echo: int, now_s: float) -> None:
        """The receiver's cumulative counts (an Ack); out-of-date counts are ignored."""
        if echo != NO_ECHO:
            seq, sent_s = self._sent_at[echo % _RING]
            if seq == echo:
                sample_s = now_s - sent_s
                self.srtt_s = sample_s if self.srtt_s == 0 else 0.875 * self.srtt_s + 0.125 * sample_s
                self.min_rtt_s = sample_s if self.min_rtt_s == 0 else min(self.min_rtt_s, sample_s)
        last_sent, last_received, last_ce = self._acked
        if sent < last_sent or received < last_received or (sent, received) == (last_sent, last_received):
            return
        lost = max(0, (sent - received) - (last_sent - last_received))
        marked = max(0, ce - last_ce)
        self._lost += lost
        self._received += received - last_received
        self._ce += marked
        self._acked = (sent, received, ce)
        if _after((sent - 1) % U32, self._highest) and _after(self.seq, sent % U32):
            self._highest = (sent - 1) % U32
        self._feedback_s = now_s
        self._sent_since_feedback = False
        if (lost or marked) and _after((sent - 1) % U32, self._recover_seq):
            self._cut(now_s)
        else:
            self.on_timer(now_s)

    def _cut(self, now_s: float) -> None:
        fraction = min(1.0, (self._ce + self._lost) / max(1, self._received + self._lost))
        self.alpha = (1 - self.p.gain) * self.alpha + self.p.gain * fraction
        cut = max(self.alpha, fraction) if self._lost else self.alpha
        self.slow_start = False
        self.target_bytes_per_s = self.rate_bytes_per_s
        self._clean = 0
        self._recover_seq = self.seq
        self._set(self.rate_bytes_per_s * (1 - cut / 2), now_s)

    @property
    def timer_s(self) -> float:
        """When :meth:`on_timer` would back off for want of feedback (INF: nothing sent since the last Ack).

        Increases need no timer of their own: they come with Acks (:meth:`on_ack` calls :meth:`on_timer`).
        """
        return self._feedback_s + self.p.feedback_timeout_s if self._sent_since_feedback else math.inf

    def on_timer(self, now_s: float) -> None:
        """Increase after a clean period; back off when feedback has stopped."""
        if self._sent_since_feedback and now_s >= self._feedback_s + self.p.feedback_timeout_s:  # as timer_s
            self.slow_start = False
            self._feedback_s = now_s
            self._recover_seq = self.seq
            self._highest = (self.seq - 1) % U32  # give up on what is in flight
            self._set(self.rate_bytes_per_s / 2, now_s)
            return
        elapsed_s = now_s - self._changed_s
        if elapsed_s < max(self.p.interval_s, self.srtt_s) or not self._received:
            return
        rate = self.rate_bytes_per_s
        if self._ce or self._lost:  # signals from before the last cut: they only teach α
            fraction = (self._ce + self._lost) / (self._received + self._lost)
            self.alpha = (1 - self.p.gain) * self.alpha + self.p.gain * fraction
            self._set(rate, now_s)
            return
        self.alpha = (1 - self.p.gain) * self.alpha
        if self._used_bytes < 0.5 * rate * elapsed_s:  # application-limited: hold
            self._set(rate, now_s)
        elif self.slow_start:
            self._set(2 * rate, now_s)
        else:
            self._clean += 1
            if self._clean > 5:
                self.target_bytes_per_s += self.p.increase_bytes_per_s
            self._set((rate + self.target_bytes_per_s) / 2, now_s)

    def _set(self, rate: float, now_s: float) -> None:
        self._refill(now_s)
        if rate < self.rate_bytes_per_s:
            self.decreases += 1
        self.rate_bytes_per_s = min(self.p.max_rate_bytes_per_s, max(self.p.min_rate_bytes_per_s, rate))
        self.target_bytes_per_s = min(self.target_bytes_per_s, self.p.max_rate_bytes_per_s)
        self._changed_s = now_s
        self._used_bytes = 0.0
        self._ce = self._lost = self._received = 0
