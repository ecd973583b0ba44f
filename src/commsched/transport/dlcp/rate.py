"""DLCP's sender rate control: DCTCP-style AIMD on a paced rate, clock-free.

One :class:`RateControl` per destination. It never reads the configured link
rate: it starts at ``initial_rate_bytes_per_s`` and learns from the
receiver's :class:`~commsched.transport.dlcp.protocol.Ack` feedback, which
counts DATA datagrams sent (by sequence number), received and CE-marked.

Once per ``interval_s`` (≈ one round trip; at most one change per interval):

- the congestion fraction of the interval ``F = (ce + lost) / (received + lost)``
  feeds DCTCP's estimate ``α ← (1 − g)·α + g·F``;
- CE marks only: ``rate ← rate · (1 − α/2)`` (DCTCP's cut);
- losses: ``rate ← rate · (1 − max(α, F)/2)``: a queue that overflows (F
  large) is cut at once, up to half, while a rare random loss (a gray link,
  F small) costs little — a bounded-loss transport tolerates it anyway;
- deliveries and no signal: slow start doubles the rate until the first signal, then
  ``rate += increase_bytes_per_s`` — but only if the sender used at least
  half its allowance (an application-limited sender does not inflate it).

If no feedback arrives for ``feedback_timeout_s`` while sending, the rate
halves (everything is being lost: back off rather than keep flooding). The
rate stays within ``[min_rate_bytes_per_s, max_rate_bytes_per_s]``.

Pacing is a token bucket of ``burst_bytes``: a packet may go while the
bucket is positive (:meth:`RateControl.delay_s` is 0) and its bytes are
taken when it goes (:meth:`RateControl.on_send`). Re-sends pay like first
sends, so retransmissions can never add load beyond the rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateParams:
    """Knobs of :class:`RateControl`; defaults suit a datacenter host (round trips ≲ 1 ms)."""

    initial_rate_bytes_per_s: float = 12.5e6
    min_rate_bytes_per_s: float = 1e6
    max_rate_bytes_per_s: float = float("inf")
    increase_bytes_per_s: float = 10e6
    gain: float = 1 / 16
    interval_s: float = 0.002
    burst_bytes: float = 64 * 1024
    feedback_timeout_s: float = 0.1


class RateControl:
    """The allowed sending rate toward one destination (bytes/s), from feedback events and ``now_s``."""

    __slots__ = (
        "_acked", "_ce", "_changed_s", "_feedback_s", "_lost", "_received", "_sent_since_feedback", "_stamp_s",
        "_tokens", "_used_bytes", "alpha", "decreases", "p", "rate_bytes_per_s", "slow_start",
    )  # fmt: skip

    def __init__(self, params: RateParams | None = None, now_s: float = 0.0) -> None:
        self.p = params if params is not None else RateParams()
        self.rate_bytes_per_s = self.p.initial_rate_bytes_per_s
        self.alpha = 0.0
        self.slow_start = True
        self.decreases = 0
        self._tokens = self.p.burst_bytes
        self._stamp_s = now_s
        self._changed_s = now_s
        self._feedback_s = now_s
        self._used_bytes = 0.0
        self._sent_since_feedback = False
        self._acked = (0, 0, 0)  # cumulative (sent, received, ce) of the last Ack
        self._ce = self._lost = self._received = 0  # this interval's

    # ---- pacing ----

    def _refill(self, now_s: float) -> None:
        if now_s > self._stamp_s:
            self._tokens = min(self.p.burst_bytes, self._tokens + self.rate_bytes_per_s * (now_s - self._stamp_s))
            self._stamp_s = now_s

    def delay_s(self, now_s: float) -> float:
        """How long until a packet may go (0: now)."""
        self._refill(now_s)
        return 0.0 if self._tokens > 0 else -self._tokens / self.rate_bytes_per_s + 1e-6

    def on_send(self, nbytes: int, now_s: float) -> None:
        """A datagram of ``nbytes`` (on the wire) went out."""
        self._refill(now_s)
        self._tokens -= nbytes
        self._used_bytes += nbytes
        self._sent_since_feedback = True

    # ---- feedback ----

    def on_ack(self, sent: int, received: int, ce: int, now_s: float) -> None:
        """The receiver's cumulative counts (an Ack); out-of-date counts are ignored."""
        last_sent, last_received, last_ce = self._acked
        if sent < last_sent or received < last_received or (sent, received) == (last_sent, last_received):
            return
        self._lost += max(0, (sent - received) - (last_sent - last_received))
        self._received += received - last_received
        self._ce += max(0, ce - last_ce)
        self._acked = (sent, received, ce)
        self._feedback_s = now_s
        self._sent_since_feedback = False
        self.on_timer(now_s)

    def on_timer(self, now_s: float) -> None:
        """Apply this interval's feedback once it is over; back off when feedback has stopped."""
        if self._sent_since_feedback and now_s - self._feedback_s >= self.p.feedback_timeout_s:
            self._set(self.rate_bytes_per_s / 2, now_s)
            self.slow_start = False
            self._feedback_s = now_s
            return
        elapsed_s = now_s - self._changed_s
        if elapsed_s < self.p.interval_s:
            return
        signals = self._ce + self._lost
        if signals:
            fraction = min(1.0, signals / max(1, self._received + self._lost))
            self.alpha = (1 - self.p.gain) * self.alpha + self.p.gain * fraction
            cut = max(self.alpha, fraction) if self._lost else self.alpha
            self.slow_start = False
            self._set(self.rate_bytes_per_s * (1 - cut / 2), now_s)
        elif self._received:  # delivery confirmed, nothing lost or marked
            self.alpha = (1 - self.p.gain) * self.alpha
            if self._used_bytes >= 0.5 * self.rate_bytes_per_s * elapsed_s:
                grown = self.rate_bytes_per_s * 2 if self.slow_start else self.rate_bytes_per_s
                self._set(grown + (0 if self.slow_start else self.p.increase_bytes_per_s), now_s)
            else:
                self._changed_s = now_s
                self._used_bytes = 0.0

    def _set(self, rate: float, now_s: float) -> None:
        self._refill(now_s)
        if rate < self.rate_bytes_per_s:
            self.decreases += 1
        self.rate_bytes_per_s = min(self.p.max_rate_bytes_per_s, max(self.p.min_rate_bytes_per_s, rate))
        self._changed_s = now_s
        self._used_bytes = 0.0
        self._ce = self._lost = self._received = 0
