"""DLCP's clock-free sender and receiver: completion at the bound, Probe/Bitmap/re-send, Stop, deadline."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.transport.dlcp.protocol import (
    CE,
    ECT0,
    REPORT,
    Accept,
    Ack,
    Action,
    Bitmap,
    Data,
    PeerFeedback,
    Probe,
    ReceiverState,
    Stop,
    allowed_missing,
    classify,
    tos_byte,
)
from commsched.transport.dlcp.sender import SenderState
from commsched.transport.dlcp.wire import NO_ECHO, NO_SAMPLE


def feed(rx: ReceiverState, offsets: list[int], stride: int) -> list[Action]:
    out: list[Action] = []
    for offset in offsets:
        rx.on_data(offset, min(stride, rx.numel - offset), stride, out)
    return out


def test_by_default_a_loss_free_receive_ends_complete_whatever_the_bound() -> None:
    rx = ReceiverState(100, loss_bound=0.5)
    assert feed(rx, list(range(0, 90, 10)), 10) == [] and rx.ended is None  # within the bound, but no probe yet
    assert feed(rx, [90], 10) == [Stop(100)]
    assert (rx.ended, rx.lost) == ("complete", 0)


def test_by_default_the_bound_is_used_once_the_sender_probed_and_on_resends_after() -> None:
    rx = ReceiverState(100, loss_bound=0.2)
    feed(rx, [0, 10, 20, 30, 40, 50, 60, 70], 10)
    out: list[Action] = []
    rx.on_probe(1, out)
    assert out == [Stop(80)] and (rx.ended, rx.missing()) == ("bound", ((80, 100),))
    rx = ReceiverState(100, loss_bound=0.2)
    feed(rx, [0, 10, 20, 30, 40, 50], 10)
    out = []
    rx.on_probe(1, out)
    assert out == [Bitmap(1, ((60, 100),))] and rx.ended is None
    assert feed(rx, [70], 10) == []  # 30 missing: still above the bound
    assert feed(rx, [90], 10) == [Stop(80)] and rx.ended == "bound"


def test_the_receiver_stops_exactly_when_the_missing_elements_reach_the_bound_with_stop_at_count() -> None:
    rx = ReceiverState(100, loss_bound=0.2, stop_at_count=True)
    assert rx.allowed == 20
    assert feed(rx, [0, 10, 20, 30, 40, 50, 60], 10) == [] and rx.ended is None
    assert feed(rx, [70], 10) == [Stop(80)]
    assert (rx.ended, rx.lost, rx.missing()) == ("bound", 20, ((80, 100),))
    assert feed(rx, [80], 10) == [] and rx.received == 80  # late packets are not taken


def test_at_bound_zero_the_receiver_needs_every_element_and_ends_complete() -> None:
    rx = ReceiverState(95, loss_bound=0.0)
    assert feed(rx, list(range(0, 90, 10)), 10) == [] and rx.missing() == ((90, 95),)
    assert feed(rx, [90], 10) == [Stop(95)]
    assert (rx.ended, rx.lost, rx.missing()) == ("complete", 0, ())


def test_duplicates_and_packets_off_the_grid_are_not_taken() -> None:
    rx = ReceiverState(100)
    out: list[Action] = []
    assert rx.on_data(10, 10, 10, out) is Accept.NEW
    assert rx.on_data(10, 10, 10, out) is Accept.DUPLICATE
    assert rx.on_data(15, 10, 10, out) is Accept.MISMATCH  # off the grid
    assert rx.on_data(20, 10, 20, out) is Accept.MISMATCH  # another stride
    assert rx.on_data(90, 5, 10, out) is Accept.MISMATCH  # wrong size
    assert rx.on_data(100, 10, 10, out) is Accept.MISMATCH  # past the end
    assert (rx.received, rx.duplicates, out) == (10, 1, [])


def test_the_deadline_ends_with_what_arrived_and_flags_it() -> None:
    rx = ReceiverState(100, loss_bound=0.0, deadline_s=5.0)
    feed(rx, [0, 10], 10)
    out: list[Action] = []
    assert not rx.deadline(4.9, out) and out == []
    assert rx.deadline(5.0, out) and out == [Stop(20)]
    assert (rx.ended, rx.lost, rx.missing()) == ("deadline", 80, ((20, 100),))
    assert rx.on_data(20, 10, 10, out) is Accept.LATE


def test_a_probe_gets_the_holes_then_stop_once_finished() -> None:
    rx = ReceiverState(100, loss_bound=0.1)
    feed(rx, [0, 20, 30, 60, 70, 80], 10)
    out: list[Action] = []
    rx.on_probe(3, out)
    assert out == [Bitmap(3, ((10, 20), (40, 60), (90, 100)))]
    feed(rx, [10, 40, 50], 10)
    out.clear()
    rx.on_probe(4, out)
    assert out == [Stop(90)]


def test_the_sender_sends_important_packets_first_then_probes_after_a_delay() -> None:
    tx = SenderState(50, 10, np.array([0, 1, 0, 1, 1], dtype=np.uint8), probe_delay_s=0.5, probe_timeout_s=2.0)
    out: list[Action] = []
    tx.next_packets(0.0, 3, out)
    assert [(d.offset, d.important) for d in out if isinstance(d, Data)] == [(10, 1), (30, 1), (40, 1)]
    out.clear()
    tx.next_packets(0.0, 10, out)
    assert out == [Data(0, 10, 0, False), Data(20, 10, 0, False)] and not tx.pending
    out.clear()
    tx.next_packets(0.4, 10, out)
    assert out == []  # the last datagrams may still be landing
    tx.next_packets(0.5, 10, out)
    assert out == [Probe(1)]
    out.clear()
    tx.next_packets(1.0, 10, out)
    assert out == []
    tx.next_packets(2.5, 10, out)
    assert out == [Probe(2)]  # unanswered: probe again


def test_a_bitmap_queues_exactly_its_holes_and_stop_ends_the_send() -> None:
    tx = SenderState(95, 10)
    out: list[Action] = []
    tx.next_packets(0.0, 100, out)
    tx.next_packets(1.0, 100, out)
    assert out[-1] == Probe(1)
    tx.on_bitmap(0, ((0, 10),))  # an answer to another probe: ignored
    assert not tx.pending
    tx.on_bitmap(1, ((10, 30), (90, 95)))
    out.clear()
    tx.next_packets(1.0, 100, out)
    assert out == [Data(10, 10, 1, True), Data(20, 10, 1, True), Data(90, 5, 1, True)]
    assert (tx.sent, tx.resent) == (10, 3)
    tx.on_bitmap(1, ((40, 50),))
    tx.on_stop()
    out.clear()
    tx.next_packets(9.0, 100, out)
    assert out == [] and tx.done and not tx.pending


def test_a_second_answer_to_the_same_probe_queues_nothing_more() -> None:
    tx = SenderState(95, 10)
    out: list[Action] = []
    tx.next_packets(0.0, 100, out)
    tx.next_packets(1.0, 100, out)
    tx.on_bitmap(1, ((10, 30),))
    out.clear()
    tx.next_packets(1.0, 100, out)
    assert out == [Data(10, 10, 1, True), Data(20, 10, 1, True)]
    tx.on_bitmap(1, ((10, 30),))  # the same answer's other copy, after its re-sends left
    out.clear()
    tx.next_packets(1.0, 100, out)
    assert out == [] and tx.resent == 2


def run_transfer(
    numel: int,
    stride: int,
    bound: float,
    lose: Callable[[Data], bool],
    *,
    rounds: int = 1000,
    stop_at_count: bool = False,
) -> tuple[SenderState, ReceiverState, np.ndarray]:
    """Drive a sender and a receiver with a lossy data path (control is reliable); returns what was written."""
    tx = SenderState(numel, stride, probe_delay_s=0.0, probe_timeout_s=1.0)
    rx = ReceiverState(numel, loss_bound=bound, stop_at_count=stop_at_count)
    written = np.zeros(numel, dtype=bool)
    for step in range(rounds):
        if tx.done:
            break
        out: list[Action] = []
        tx.next_packets(float(step), 7, out)
        for action in out:
            back: list[Action] = []
            if isinstance(action, Data) and not lose(action):
                if rx.on_data(action.offset, action.numel, stride, back) is Accept.NEW:
                    assert not written[action.offset : action.offset + action.numel].any()
                    written[action.offset : action.offset + action.numel] = True
            elif isinstance(action, Probe):
                rx.on_probe(action.seq, back)
            for reply in back:
                if isinstance(reply, Stop):
                    tx.on_stop()
                elif isinstance(reply, Bitmap):
                    tx.on_bitmap(reply.seq, reply.holes)
    return tx, rx, written


def test_probe_bitmap_resend_closes_every_hole_at_bound_zero() -> None:
    rng = random.Random(1)
    tx, rx, written = run_transfer(1000, 7, 0.0, lambda d: not d.resend and rng.random() < 0.3)
    assert rx.ended == "complete" and written.all() and tx.done and tx.resent > 0


@given(
    numel=st.integers(1, 3000),
    stride=st.integers(1, 64),
    bound=st.floats(0.0, 1.0),
    loss=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**32 - 1),
    stop_at_count=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_the_receiver_never_ends_with_more_than_the_bound_missing(
    numel: int, stride: int, bound: float, loss: float, seed: int, stop_at_count: bool
) -> None:
    rng = random.Random(seed)
    tx, rx, written = run_transfer(
        numel, stride, bound, lambda _d: rng.random() < loss, rounds=100_000, stop_at_count=stop_at_count
    )
    assert rx.ended in ("complete", "bound") and tx.done
    missing = int((~written).sum())
    assert missing == rx.lost <= math.floor(bound * numel) + 0
    assert missing <= allowed_missing(numel, bound)
    assert sum(b - a for a, b in rx.missing()) == missing
    for a, b in rx.missing():
        assert not written[a:b].any()
    if bound == 0.0 or (loss == 0.0 and not stop_at_count):  # nothing lost on the way: nothing given up
        assert written.all() and rx.ended == "complete"


def test_the_bound_is_floored_exactly() -> None:
    assert allowed_missing(10, 0.1) == 1
    assert allowed_missing(100, 0.29) == 28  # 0.29 as a double is a hair below 0.29
    assert allowed_missing(7, 0.0) == 0 and allowed_missing(7, 1.0) == 7
    with pytest.raises(ValueError):
        allowed_missing(10, 1.5)


def test_an_empty_transfer_is_finished_at_once() -> None:
    assert ReceiverState(0).ended == "complete" and SenderState(0, 10).done


def test_classify_marks_chunks_at_or_above_the_quantile_or_by_layer_class() -> None:
    norms = np.array([1.0, 4.0, 2.0, 3.0, float("nan")])
    assert classify(norms, layer_class=2, quantile=0.5).tolist() == [0, 1, 0, 1, 1]
    assert classify(norms, layer_class=2, quantile=0.0).tolist() == [1, 1, 1, 1, 1]
    assert classify(norms, layer_class=2, quantile=1.0).tolist() == [0, 1, 0, 0, 1]
    assert classify(norms, layer_class=0, quantile=1.0).tolist() == [1] * 5
    assert classify(norms, layer_class=1, quantile=1.0, important_layer_classes=2).tolist() == [1] * 5
    assert classify(norms, layer_class=1, quantile=1.0, important_layer_classes=0).tolist() == [0, 1, 0, 0, 1]


def test_tos_byte_puts_important_packets_in_their_layer_class_with_ect() -> None:
    assert tos_byte(0, True) == 32 << 2 | ECT0 == 0x82
    assert tos_byte(3, True) == tos_byte(9, True) == 8 << 2 | ECT0
    assert tos_byte(0, False) == tos_byte(5, False) == 0
    assert all(tos_byte(p, True) & CE == ECT0 for p in range(8))


def test_peer_feedback_counts_gaps_through_sequence_wrap_and_acks_every_n() -> None:
    fb = PeerFeedback(every=3, interval_s=1.0)
    out: list[Action] = []
    start = 2**32 - 2
    for seq, ce in [(start, False), (start + 1, True), (start + 3, False)]:  # start + 2 is lost
        fb.on_data(seq % 2**32, ce, 0.0, out)
    assert out == [Ack(start + 4, 3, 1, (start + 3) % 2**32)]
    fb.on_data((start + 2) % 2**32, False, 0.5, out)  # late: behind the highest, counted received only
    fb.on_timer(0.9, out)
    assert len(out) == 1
    fb.on_timer(1.0, out)
    assert out[-1] == Ack(start + 4, 4, 1, NO_ECHO)


def test_the_last_ack_goes_once_more_when_no_datagram_follows_it() -> None:
    fb = PeerFeedback(every=2, interval_s=0.005)
    out: list[Action] = []
    fb.on_data(0, False, 0.0, out)
    fb.on_data(1, False, 0.001, out)
    assert out == [Ack(2, 2, 0, 1)] and fb.timer_s == pytest.approx(0.006)
    fb.on_timer(0.0059, out)
    assert len(out) == 1
    fb.on_timer(0.006, out)  # nothing came after it: the same counts again, no round-trip sample
    assert out[-1] == Ack(2, 2, 0, NO_SAMPLE) and fb.timer_s == math.inf
    fb.on_timer(1.0, out)
    assert len(out) == 2  # once only
    fb.on_data(2, False, 1.0, out)  # a datagram after an Ack cancels its repeat; the timer Ack then follows
    fb.on_data(3, False, 1.001, out)
    fb.on_data(4, False, 1.002, out)
    assert out[-1] == Ack(4, 4, 0, 3) and fb.timer_s == pytest.approx(1.006)
    fb.on_timer(1.006, out)
    assert out[-1] == Ack(5, 5, 0, NO_ECHO)  # 4 was unacknowledged: a timer Ack, not a repeat


def test_a_hole_asked_for_again_is_resent_important_and_a_requeued_packet_keeps_its_class() -> None:
    importance = np.array([1, 0, 1, 0, 0], dtype=np.uint8)
    sender = SenderState(50, 10, importance)
    out: list[Action] = []
    sender.next_packets(0.0, 5, out)
    assert [a.important for a in out if isinstance(a, Data)] == [1, 1, 0, 0, 0]
    sender.requeue(40)  # the host refused it: it goes again as it was, unimportant
    out.clear()
    sender.next_packets(0.5, 5, out)
    assert [(a.offset, a.important, a.resend) for a in out if isinstance(a, Data)] == [(40, 0, True)]
    sender.next_packets(1.0, 5, out)  # nothing left: a PROBE
    sender.on_bitmap(1, [(10, 20), (30, 40)])  # two unimportant packets are missing, beyond the bound
    out.clear()
    sender.next_packets(1.0, 5, out)
    assert [(a.offset, a.important, a.resend) for a in out if isinstance(a, Data)] == [(10, 1, True), (30, 1, True)]
    assert importance.tolist() == [1, 0, 1, 0, 0]  # the caller's array is left as it was


def test_a_packet_that_could_not_leave_the_host_goes_again_before_the_others_and_only_once() -> None:
    tx = SenderState(50, 10)
    out: list[Action] = []
    tx.next_packets(0.0, 2, out)
    tx.requeue(10)
    tx.requeue(10)
    out.clear()
    tx.next_packets(0.0, 10, out)
    assert [(d.offset, d.resend) for d in out if isinstance(d, Data)] == [
        (10, True),
        (20, False),
        (30, False),
        (40, False),
    ]
    tx.on_stop()
    tx.requeue(0)
    assert not tx.pending


def arrivals(fb: PeerFeedback, seqs: list[int]) -> list[int | None]:
    out: list[Action] = []
    return [fb.on_data(seq % 2**32, False, 0.0, out) for seq in seqs]


def test_a_gap_is_reported_once_it_outlives_reorder_later_numbers_and_once_only() -> None:
    fb = PeerFeedback(every=100, reorder=3)
    # 2 is lost: seen missing at 3, reported at 6 (three numbers later), as lost before 4
    assert arrivals(fb, [0, 1, 3, 4, 5, 6, 7]) == [None, None, None, None, None, 4, None]
    # a second loss (9) is a new gap, reported on its own
    assert arrivals(fb, [8, 10, 11, 12, 13]) == [None, None, None, None, 11]


def test_a_datagram_overtaken_by_fewer_than_reorder_later_ones_is_not_reported() -> None:
    fb = PeerFeedback(every=100, reorder=3)
    assert arrivals(fb, [0, 2, 3, 1, 4, 5, 6, 7]) == [None] * 8  # 1 came late, within the reorder window
    fb = PeerFeedback(every=100, reorder=2)  # the first datagram lost is a gap like any other
    assert arrivals(fb, [1, 2, 3]) == [None, None, 2]
    with pytest.raises(ValueError, match="reorder"):
        PeerFeedback(reorder=0)


def test_a_receiver_reports_its_holes_and_its_bound_only_while_under_way() -> None:
    rx = ReceiverState(100, loss_bound=0.1)
    out: list[Action] = []
    rx.report(7, out)
    assert out == []  # nothing arrived yet: its sender may not have started
    feed(rx, [0, 20, 30], 10)
    rx.report(7, out)
    assert out == [Bitmap(REPORT, ((10, 20), (40, 100)), 7, 10)]
    feed(rx, [10, 40, 50, 60, 70, 80, 90], 10)  # complete: a Stop, and no more reports
    out.clear()
    rx.report(9, out)
    assert out == []


def test_a_report_resends_only_holes_numbered_before_it_unimportant_first_within_the_bound() -> None:
    importance = np.array([1, 0, 1, 0, 1, 1], dtype=np.uint8)  # sent 0 2 4 5, then 1 3
    tx = SenderState(60, 10, importance)
    out: list[Action] = []
    tx.next_packets(0.0, 5, out)  # offsets 0 20 40 50 10 leave as numbers 100..104
    for seq, act in enumerate(out, start=100):
        assert isinstance(act, Data)
        tx.numbered(act.offset, seq)
    # the receiver lost 20 (101) and 10 (104): its report names every hole, but only 101 left before 104
    tx.on_bitmap(REPORT, ((10, 30), (30, 40)), below=104, allowed=0)
    out.clear()
    tx.next_packets(0.1, 1, out)
    assert out == [Data(20, 10, 1, True)] and tx.reported == 1
    tx.numbered(20, 105)
    # the same report again (its TCP copy), and an answer to no probe: nothing more
    tx.on_bitmap(REPORT, ((10, 30), (30, 40)), below=104, allowed=0)
    tx.on_bitmap(3, ((10, 30),))
    assert tx.reported == 1
    # now 10 (104) is lost too, and the bound spares 10 elements: the unimportant packet is spared, not re-sent
    tx.on_bitmap(REPORT, ((10, 20), (30, 40)), below=106, allowed=10)
    assert (tx.reported, tx.spared) == (1, 10)
    out.clear()
    tx.next_packets(0.2, 5, out)
    assert [(a.offset, a.resend) for a in out if isinstance(a, Data)] == [(30, False)]
    # a report with no allowance left re-sends the next loss, though unimportant
    tx.numbered(30, 106)
    tx.on_bitmap(REPORT, ((10, 20), (30, 40)), below=110, allowed=10)
    out.clear()
    tx.next_packets(0.3, 5, out)
    assert [(a.offset, a.resend) for a in out if isinstance(a, Data)] == [(30, True)] and tx.reported == 2
