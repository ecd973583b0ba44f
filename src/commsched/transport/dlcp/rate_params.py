"""The knobs of DLCP's sender rate control (:class:`~commsched.transport.dlcp.rate.RateControl`), apart from the
state machine that reads them; compiled with it (:mod:`commsched._compiled`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateParams:
    """Knobs of :class:`RateControl`; the defaults suit a host whose loop wakes every ~0.1-1 ms.

    - ``initial_rate_bytes_per_s``: where a sender starts, before slow start
      finds the path's rate (100 Mbit/s: a small share of any data-centre
      link; doubled every round trip).
    - ``min_rate_bytes_per_s``: a floor, so that the rate never reaches 0;
      below any fair share expected (8 Mbit/s: 1/1250 of 10 Gbit/s). It does
      not set how fast a sender recovers: from a rate below one datagram per
      round trip the increase about doubles the rate each round.
    - ``gain``: DCTCP's ``g`` (1/16, the DCTCP paper's and Linux's).
    - ``alpha_init``: α before any round (1, Linux DCTCP's
      ``dctcp_alpha_on_init``): nothing is known of the path, so the first
      mark halves the rate, as TCP leaves slow start.
    - ``loss_tolerance``: on a path that has never marked, the loss fraction
      (α's estimate) up to which a loss is answered in proportion, like a
      mark, and above which it halves the rate. A link's random loss drops
      a steady fraction whatever the rate, and halving for each of them
      keeps the rate far below the link; a sender overflowing a drop-tail
      buffer loses more and more until α passes the tolerance. 5 %: DLCP
      tolerates loss (what it costs is re-sends and the bound, not
      collapse), so its own losses are held near this, not near TCP's
      2/window per round trip (docs/dlcp.md, "Rate control").
    - ``burst_bytes``: the pacer's bucket; at least one datagram.
    - ``feedback_timeout_s``: the least time without feedback before giving
      up on what is in flight (RFC 6298's minimum RTO). 50 ms: a Python
      receiver stalls for garbage collection or the GIL for tens of
      milliseconds, and a shorter timer would cut the rate for a silence that
      is the receiver's, not the network's.
    - ``ack_slack``: at least the receivers' :class:`~commsched.transport.dlcp.protocol.PeerFeedback` ``every``.
    - ``rtt_floor_s``: the least round trip the window assumes, for receivers
      whose answer time varies well above the fastest one measured (a Python
      receiver loop: about a millisecond).
    - ``initial_window``: datagrams in flight before the first round trip is
      measured (10: TCP's initial window, RFC 6928), or ``ack_slack`` if more,
      so that the first Ack does not wait for the receiver's timer.
    """

    initial_rate_bytes_per_s: float = 12.5e6
    min_rate_bytes_per_s: float = 1e6
    max_rate_bytes_per_s: float = float("inf")
    gain: float = 1 / 16
    alpha_init: float = 1.0
    loss_tolerance: float = 0.05
    burst_bytes: float = 8 * 1024
    feedback_timeout_s: float = 0.05
    ack_slack: int = 32
    rtt_floor_s: float = 0.0
    initial_window: int = 10
