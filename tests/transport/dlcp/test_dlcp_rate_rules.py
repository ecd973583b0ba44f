"""The rate control's rules, one at a time, by feeding :class:`RateControl` Acks by hand (no clock, no network).

Sequence numbers count from 0; an Ack says ``(sent, received, ce)``:
the receiver saw datagrams up to ``sent - 1``, ``received`` of them, ``ce``
of those marked. ``echo`` names the datagram a round-trip sample is taken from.
"""

from __future__ import annotations

import math

import pytest

from commsched.transport.dlcp.rate import RateControl, RateParams
from commsched.transport.dlcp.wire import NO_ECHO, NO_SAMPLE

DATAGRAM = 1500
RTT_S = 100e-6
G = 1 / 16


def sender(**params: float) -> RateControl:
    """A sender with a measured round trip (100 µs), past slow start's first round, far above its floor
    (two datagrams per round trip: 30 MB/s)."""
    rc = RateControl(RateParams(**{"initial_rate_bytes_per_s": 1e9, **params}), 0.0)  # type: ignore[arg-type]
    rc.on_send(DATAGRAM, 0.0)
    rc.on_ack(1, 1, 0, 0, RTT_S)
    return rc


def send(rc: RateControl, n: int, now_s: float) -> None:
    for _ in range(n):
        rc.on_send(DATAGRAM, now_s)


def test_alpha_is_an_ewma_of_the_fraction_marked_in_each_round() -> None:
    rc = sender(alpha_init=0.0)
    assert rc.alpha == 0.0  # a clean first round
    send(rc, 8, 0.001)  # round 2 starts with datagram 1
    rc.on_ack(9, 9, 2, 8, 0.001 + RTT_S)  # 2 of the round's 8 marked
    assert rc.rounds == 2 and rc.alpha == pytest.approx(G * 2 / 8)
    send(rc, 8, 0.002)
    rc.on_ack(17, 17, 2 + 8, 16, 0.002 + RTT_S)  # all 8 marked
    assert rc.alpha == pytest.approx((1 - G) * G * 2 / 8 + G * 1.0)


def test_a_mark_cuts_by_alpha_over_two_once_per_round_trip() -> None:
    rc = sender(alpha_init=0.5)
    send(rc, 8, 0.001)
    rate, alpha = rc.rate_bytes_per_s, rc.alpha
    rc.on_ack(5, 5, 1, 4, 0.001 + RTT_S)  # a mark on a datagram sent before any cut: cut at once
    assert rc.rate_bytes_per_s == pytest.approx(rate * (1 - alpha / 2)) and rc.decreases == 1
    cut = rc.rate_bytes_per_s
    rc.on_ack(9, 9, 4, 8, 0.001 + RTT_S)  # more marks on datagrams sent before the cut: the same congestion
    assert rc.rate_bytes_per_s == cut and rc.decreases == 1
    alpha = rc.alpha
    send(rc, 4, 0.002)  # sent after the cut
    rc.on_ack(13, 13, 5, 12, 0.002 + RTT_S)
    assert rc.rate_bytes_per_s == pytest.approx(cut * (1 - alpha / 2)) and rc.decreases == 2


def test_the_cut_grows_with_the_fraction_marked() -> None:
    def after_marks(fraction: float) -> float:
        rc = sender(alpha_init=0.0)
        now, seq, ce = 0.001, 1, 0
        for _ in range(40):  # 40 rounds of 20 datagrams, `fraction` of them marked
            send(rc, 20, now)
            seq += 20
            ce += round(20 * fraction)
            rc.on_ack(seq, seq, ce, seq - 1, now + RTT_S)
            now += 0.001
        return rc.alpha

    low, high = after_marks(0.1), after_marks(0.6)
    assert low == pytest.approx(0.1 * (1 - (1 - G) ** 40), rel=0.05)
    assert high == pytest.approx(0.6 * (1 - (1 - G) ** 40), rel=0.05)
    assert high / low == pytest.approx(6, rel=0.05)


def test_reordering_that_resolves_within_the_window_is_not_loss() -> None:
    rc = sender()
    send(rc, 10, 0.001)
    rate = rc.rate_bytes_per_s
    # datagrams 1-3 (a lower priority band) overtaken by 4-10: the receiver saw up to 10 but only 8 of 11
    rc.on_ack(11, 8, 0, 10, 0.001 + RTT_S)
    assert rc.lost == 0
    rc.on_ack(11, 11, 0, NO_ECHO, 0.001 + RTT_S + rc.reorder_window_s / 2)  # they arrive, within the window
    rc.on_ack(11, 11, 0, NO_ECHO, 0.001 + 3 * RTT_S)
    assert rc.lost == 0 and rc.reordered == 0 and rc.decreases == 0 and rc.rate_bytes_per_s >= rate


def test_a_datagram_missing_for_the_reordering_window_is_lost_and_cuts_once() -> None:
    rc = sender()
    send(rc, 10, 0.001)
    t0 = 0.001 + RTT_S
    rc.on_ack(11, 8, 0, 10, t0)  # 3 missing: not lost yet, they may be overtaken
    rate = rc.rate_bytes_per_s
    assert rc.lost == 0 and rc.decreases == 0
    send(rc, 2, t0)
    rc.on_ack(12, 9, 0, 11, t0 + rc.reorder_window_s)  # still 3 missing a reordering window later: lost
    assert rc.lost == 3
    assert rc.rate_bytes_per_s == rate / 2 and not rc.marking_path  # no marks ever: an overflow, halve
    send(rc, 2, t0 + 2e-5)
    rc.on_ack(13, 9, 0, 12, t0 + 3 * rc.reorder_window_s)  # one more lost, sent before the cut: no second cut
    rc.on_ack(14, 10, 0, 13, t0 + 5 * rc.reorder_window_s)
    assert rc.lost == 4 and rc.decreases == 1


@pytest.mark.parametrize(("alpha_init", "halves"), [(0.03, False), (0.5, True)])
def test_on_a_path_that_never_marked_a_loss_halves_only_above_the_loss_tolerance(
    alpha_init: float, halves: bool
) -> None:
    rc = sender(alpha_init=alpha_init, loss_tolerance=0.05)
    send(rc, 10, 0.001)
    t0 = 0.001 + RTT_S
    rc.on_ack(11, 8, 0, 10, t0)  # 3 missing, not lost yet
    send(rc, 2, t0)
    rate, alpha = rc.rate_bytes_per_s, rc.alpha
    rc.on_ack(12, 9, 0, 11, t0 + rc.reorder_window_s)  # lost
    assert rc.lost == 3 and not rc.marking_path and rc.decreases == 1
    assert (alpha > 0.05) == halves
    if halves:  # losing more than the tolerance: an overflowing buffer, halve
        assert rc.rate_bytes_per_s == pytest.approx(rate / 2)
    else:  # losses as rare as a link's random loss: cut in proportion, as for a mark
        assert rc.rate_bytes_per_s == pytest.approx(rate * (1 - alpha / 2))


def test_a_loss_on_a_path_that_marks_is_cut_like_a_mark() -> None:
    rc = sender(alpha_init=0.2)
    send(rc, 10, 0.001)
    t0 = 0.001 + RTT_S
    rc.on_ack(11, 11, 1, 10, t0)  # a mark: cut by α/2
    send(rc, 10, t0)
    rc.on_ack(19, 17, 1, 18, t0 + RTT_S)  # sent after the cut: two missing (not lost yet)
    rate, alpha = rc.rate_bytes_per_s, rc.alpha
    send(rc, 2, t0 + RTT_S)
    rc.on_ack(21, 19, 1, 20, t0 + RTT_S + rc.reorder_window_s)  # still missing: lost
    assert rc.marking_path and rc.lost == 2
    assert rc.rate_bytes_per_s == pytest.approx(rate * (1 - alpha / 2)) and rc.decreases == 2


def test_a_datagram_counted_lost_that_arrives_widens_the_reordering_window() -> None:
    rc = sender()
    send(rc, 12, 0.001)
    t0 = 0.001 + RTT_S
    window = rc.reorder_window_s
    rc.on_ack(11, 9, 0, 10, t0)
    rc.on_ack(12, 10, 0, 11, t0 + window)
    assert rc.lost == 2
    rate = rc.rate_bytes_per_s  # halved for the two (no marks on this path)
    rc.on_ack(13, 13, 0, 12, t0 + 3 * window)  # they arrive after all
    assert rc.lost == 0 and rc.reordered == 1 and rc.reorder_window_s == pytest.approx(2 * window)
    assert rc.undone == 1 and rc.rate_bytes_per_s == 2 * rate  # the cut is undone


def test_the_feedback_timeout_cuts_once_per_period_and_doubles() -> None:
    rc = sender(feedback_timeout_s=0.01)
    send(rc, 5, 0.001)
    rate, timeout = rc.rate_bytes_per_s, rc.timeout_s
    assert rc.timer_s == pytest.approx(0.001 + timeout)
    for now in (0.001 + timeout, 0.002 + timeout, 0.5):  # fires once; nothing new was sent, so it stays disarmed
        rc.on_timer(now)
    assert rc.timeouts == 1 and rc.rate_bytes_per_s == rate / 2 and rc.inflight == 0 and rc.timer_s == math.inf
    send(rc, 1, 0.6)  # a new send re-arms it, counted from the send, and twice as long
    assert rc.timer_s == pytest.approx(0.6 + 2 * timeout)
    rc.on_timer(0.6 + 2 * timeout - 1e-6)
    assert rc.timeouts == 1
    rc.on_timer(0.6 + 2 * timeout)
    assert rc.timeouts == 2 and rc.rate_bytes_per_s == rate / 4
    send(rc, 1, 0.7)
    rc.on_ack(8, 8, 0, 7, 0.7 + RTT_S)  # feedback: the doubling ends
    send(rc, 1, 0.8)
    assert rc.timer_s == pytest.approx(0.8 + rc.timeout_s) and rc.timeout_s == pytest.approx(timeout)


def test_a_lost_tail_is_given_up_without_a_cut() -> None:
    rc = sender(feedback_timeout_s=0.01)
    send(rc, 10, 0.001)
    rc.on_ack(6, 6, 0, 5, 0.001 + RTT_S)  # the first five arrived; the last five (the burst's tail) never do
    rate = rc.rate_bytes_per_s
    assert rc.inflight == 5
    rc.on_timer(rc.timer_s)
    assert rc.timeouts == 1 and rc.inflight == 0 and rc.rate_bytes_per_s == rate


def test_after_slow_start_a_clean_round_adds_one_datagram_per_round_trip() -> None:
    rc = sender(alpha_init=1.0)
    send(rc, 10, 0.001)
    rc.on_ack(11, 11, 1, 10, 0.001 + RTT_S)  # a mark ends slow start
    assert not rc.slow_start
    rate, start = rc.rate_bytes_per_s, 0.001 + RTT_S
    n = math.ceil(rate * RTT_S / DATAGRAM)  # a round trip's worth at the rate
    send(rc, n, start)
    rc.on_ack(11 + n, 11 + n, 1, 10 + n, start + RTT_S)  # the round: from the mark's Ack to this one
    assert rc.rate_bytes_per_s == pytest.approx(rate + DATAGRAM / RTT_S)


def test_a_sender_its_window_stopped_holds_its_rate() -> None:
    rc = sender(ack_slack=2)
    rate = rc.rate_bytes_per_s
    while rc.delay_s(0.001) == 0:
        rc.on_send(DATAGRAM, 0.001)
    sent = rc.seq
    rc.on_ack(sent, sent, 0, sent - 1, 0.001 + 10 * RTT_S)  # a clean round, but the window limited it
    assert rc.rate_bytes_per_s == rate


def test_the_rate_never_falls_below_two_datagrams_per_round_trip() -> None:
    rc = sender(min_rate_bytes_per_s=1.0)
    now, seq, ce = 0.001, 1, 0
    for _ in range(60):  # every datagram marked, round after round
        send(rc, 4, now)
        seq += 4
        ce += 4
        rc.on_ack(seq, seq, ce, seq - 1, now + RTT_S)
        now += 0.001
    assert rc.decreases > 10
    assert rc.rate_bytes_per_s == pytest.approx(2 * DATAGRAM / rc.srtt_s) == rc.floor_bytes_per_s


def test_round_trips_are_measured_with_thousands_of_datagrams_in_flight() -> None:
    rc = RateControl(RateParams(), 0.0)
    for i in range(3000):
        rc.on_send(DATAGRAM, i * 1e-6)
    rc.on_ack(2901, 2901, 0, 2900, 0.0031)  # echoes datagram 2900, sent at 2.9 ms
    assert rc.srtt_s == pytest.approx(0.0002)


def test_a_repeated_ack_releases_a_full_window_without_a_round_trip_sample() -> None:
    rc = sender(ack_slack=2)
    send(rc, math.ceil(rc.window), 0.001)
    assert rc.delay_s(0.001) == math.inf  # the window is full; the Ack that would open it was lost
    srtt = rc.srtt_s
    rc.on_ack(rc.seq, rc.seq, 0, NO_SAMPLE, 0.006)  # its repeat, 5 ms later
    assert rc.inflight == 0 and rc.delay_s(0.006) == 0 and rc.timeouts == 0
    assert rc.srtt_s == srtt  # the repeat waited for the receiver's timer: no sample
