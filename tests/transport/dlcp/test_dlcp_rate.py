"""DLCP's rate control in a tiny deterministic event loop: one bottleneck, N senders, no sleeps.

The bottleneck (capacity unknown to the senders) is a FIFO with an ECN
marking threshold and a drop-tail buffer; receivers count datagrams with
:class:`PeerFeedback` and their Acks come back one propagation delay later.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from dataclasses import dataclass, field

import pytest

from commsched.transport.dlcp.protocol import Ack, Action, PeerFeedback
from commsched.transport.dlcp.rate import RateControl, RateParams

PACKET_BYTES = 1500
ONE_WAY_S = 50e-6


@dataclass
class Outcome:
    delivered_bytes: list[float]  # per flow, in the measured second half
    sent: int = 0
    dropped: int = 0
    max_queue_bytes: float = 0.0
    rates: list[list[float]] = field(default_factory=list)  # per flow, sampled


def bottleneck(
    flows: int,
    capacity_bytes_per_s: float,
    *,
    ecn_bytes: float | None,
    buffer_bytes: float,
    duration_s: float = 0.4,
    random_loss: float = 0.0,
    params: RateParams | None = None,
) -> Outcome:
    rng = random.Random(7)
    senders = [RateControl(params, 0.0) for _ in range(flows)]
    receivers = [PeerFeedback(every=16, interval_s=0.001) for _ in range(flows)]
    out = Outcome([0.0] * flows, rates=[[] for _ in range(flows)])
    events: list[tuple[float, int, str, int, object]] = []
    order = 0

    def at(t: float, kind: str, flow: int, what: object = None) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, flow, what))

    blocked = [False] * flows
    queue: list[tuple[int, int, bool]] = []  # (flow, seq, marked)
    queued_bytes = 0.0
    busy_until = 0.0
    for f in range(flows):
        at(0.0, "send", f)
        at(0.001, "tick", f)
    while events:
        now, _, kind, f, what = heapq.heappop(events)
        if now > duration_s:
            break
        if kind == "send":
            delay = senders[f].delay_s(now)
            if delay == math.inf:
                blocked[f] = True  # the window is full: an Ack or a tick reopens it
                continue
            if delay > 0:
                at(now + delay, "send", f)
                continue
            seq = senders[f].on_send(PACKET_BYTES, now)
            out.sent += 1
            if queued_bytes + PACKET_BYTES > buffer_bytes or rng.random() < random_loss:
                out.dropped += 1
            else:
                marked = ecn_bytes is not None and queued_bytes > ecn_bytes
                queue.append((f, seq, marked))
                queued_bytes += PACKET_BYTES
                out.max_queue_bytes = max(out.max_queue_bytes, queued_bytes)
                if len(queue) == 1:
                    busy_until = max(busy_until, now) + PACKET_BYTES / capacity_bytes_per_s
                    at(busy_until, "depart", -1)
            at(now, "send", f)
        elif kind == "depart":
            g, seq, marked = queue.pop(0)
            queued_bytes -= PACKET_BYTES
            at(now + ONE_WAY_S, "arrive", g, (seq, marked))
            if now > duration_s / 2:
                out.delivered_bytes[g] += PACKET_BYTES
            if queue:
                busy_until = now + PACKET_BYTES / capacity_bytes_per_s
                at(busy_until, "depart", -1)
        elif kind == "arrive":
            seq, marked = what  # type: ignore[misc]
            acks: list[Action] = []
            receivers[f].on_data(seq, marked, now, acks)
            for ack in acks:
                at(now + ONE_WAY_S, "ack", f, ack)
        elif kind == "ack":
            assert isinstance(what, Ack)
            senders[f].on_ack(what.sent, what.received, what.ce, what.echo, now)
            if blocked[f]:
                blocked[f] = False
                at(now, "send", f)
        elif kind == "tick":
            acks = []
            receivers[f].on_timer(now, acks)
            for ack in acks:
                at(now + ONE_WAY_S, "ack", f, ack)
            senders[f].on_timer(now)
            if blocked[f]:
                blocked[f] = False
                at(now, "send", f)
            out.rates[f].append(senders[f].rate_bytes_per_s)
            at(now + 0.001, "tick", f)
    return out


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


CAPACITY = 100e6  # bytes/s at the bottleneck
PARAMS = RateParams(ack_slack=16)  # the receivers here acknowledge every 16 datagrams


@pytest.mark.parametrize("flows", [1, 2, 4])
def test_with_ecn_senders_fill_the_bottleneck_fairly_without_loss(flows: int) -> None:
    out = bottleneck(flows, CAPACITY, ecn_bytes=60_000, buffer_bytes=300_000, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.9 * CAPACITY
    assert jain(out.delivered_bytes) >= 0.85
    assert out.dropped <= 0.01 * out.sent


def test_eight_senders_share_the_bottleneck_fairly_without_loss() -> None:
    # 8 windows of at least 16 datagrams (the Acks' batching, ack_slack) hold 192 kB, over the 60 kB marking
    # threshold: marks go on while every sender is window-limited, until the rates fall below their share and
    # the queue drains; so the link runs a little below full, fairly and without a drop.
    out = bottleneck(8, CAPACITY, ecn_bytes=60_000, buffer_bytes=300_000, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.85 * CAPACITY
    assert jain(out.delivered_bytes) >= 0.95
    assert out.dropped == 0


@pytest.mark.parametrize("flows", [1, 2, 4])
def test_without_ecn_losses_alone_keep_goodput_up_and_the_rate_bounded(flows: int) -> None:
    out = bottleneck(flows, CAPACITY, ecn_bytes=None, buffer_bytes=150_000, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.9 * CAPACITY
    assert out.dropped <= 0.05 * out.sent  # no congestion collapse
    late = [r for rates in out.rates for r in rates[len(rates) // 2 :]]
    assert max(late) <= 4 * CAPACITY  # grows only while at least half of it is used


def test_the_rate_grows_from_its_initial_value_to_a_fast_unknown_link() -> None:
    out = bottleneck(1, 10 * CAPACITY, ecn_bytes=600_000, buffer_bytes=3_000_000, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.9 * 10 * CAPACITY


@pytest.mark.parametrize("loss", [0.005, 0.01, 0.02])
def test_random_loss_below_the_tolerance_keeps_the_link_full(loss: float) -> None:
    # no marks: the path never marks, so the loss rule alone answers the link's random loss
    out = bottleneck(1, CAPACITY, ecn_bytes=None, buffer_bytes=300_000, random_loss=loss, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.95 * CAPACITY
    # halving for every loss, as TCP does (a tolerance of 0), leaves much of the link unused
    halving = bottleneck(
        1, CAPACITY, ecn_bytes=None, buffer_bytes=300_000, random_loss=loss,
        params=dataclasses.replace(PARAMS, loss_tolerance=0.0),
    )  # fmt: skip
    assert sum(halving.delivered_bytes) < 0.9 * sum(out.delivered_bytes)


@pytest.mark.parametrize("flows", [1, 2, 4])
def test_without_ecn_a_shallow_buffer_keeps_goodput_up_and_losses_bounded(flows: int) -> None:
    # 20 datagrams of buffer: senders overflow it, and are halved once their losses pass the tolerance
    out = bottleneck(flows, CAPACITY, ecn_bytes=None, buffer_bytes=30_000, params=PARAMS)
    assert sum(out.delivered_bytes) / 0.2 >= 0.9 * CAPACITY
    assert out.dropped <= 2 * PARAMS.loss_tolerance * out.sent
    # less even than with halving for every loss (0.98 for 2 flows), which the tolerance gives up: docs/dlcp.md
    assert jain(out.delivered_bytes) >= 0.75


def test_the_rate_starts_at_the_initial_rate_and_backs_off_without_feedback() -> None:
    params = RateParams(initial_rate_bytes_per_s=50e6, min_rate_bytes_per_s=1e6, feedback_timeout_s=0.05)
    rc = RateControl(params, 0.0)
    assert rc.rate_bytes_per_s == 50e6 and rc.delay_s(0.0) == 0
    now = 0.0
    while now < 0.06:  # a black hole: every datagram is lost, no Ack comes back
        now += rc.delay_s(now) + 1e-5
        rc.on_send(PACKET_BYTES, now)
        rc.on_timer(now)
    assert rc.rate_bytes_per_s == 25e6
    for _ in range(200):
        now += 0.05
        rc.on_send(PACKET_BYTES, now)
        rc.on_timer(now)
    assert rc.rate_bytes_per_s == params.min_rate_bytes_per_s


def test_a_full_window_holds_the_sender_until_an_ack_or_the_timeout() -> None:
    rc = RateControl(RateParams(initial_rate_bytes_per_s=15e6, ack_slack=4, feedback_timeout_s=0.05), 0.0)
    rc.on_send(PACKET_BYTES, 0.0)
    rc.on_ack(1, 1, 0, 0, 0.0001)  # one round trip of 100 µs: window 2 · rate · 1e-4 / 1500 + 4
    window = 2 * rc.rate_bytes_per_s * 1e-4 / PACKET_BYTES + 4
    assert rc.window == pytest.approx(window)
    now = 0.001
    while rc.delay_s(now) == 0:
        rc.on_send(PACKET_BYTES, now)
        now += 0.001
    assert rc.inflight == math.ceil(window) and rc.delay_s(now) == math.inf
    rc.on_ack(4, 4, 0, 3, now)  # the receiver saw up to sequence 3
    assert rc.inflight == math.ceil(window) - 3 and rc.delay_s(now) == 0
    while rc.delay_s(now) == 0:
        rc.on_send(PACKET_BYTES, now)
    rate = rc.rate_bytes_per_s
    rc.on_timer(now + 0.05)  # no feedback: give up on what is in flight, halve the rate
    assert rc.inflight == 0 and rc.rate_bytes_per_s == rate / 2


def test_an_application_limited_sender_does_not_inflate_its_rate() -> None:
    rc = RateControl(RateParams(initial_rate_bytes_per_s=10e6), 0.0)
    for i in range(1, 200):  # one datagram per ms (1.5 MB/s), all delivered
        now = i * 0.001
        rc.on_send(PACKET_BYTES, now)
        rc.on_ack(i, i, 0, i - 1, now)
    assert rc.rate_bytes_per_s == 10e6


@pytest.mark.parametrize("told", [True, False])
def test_datagrams_the_host_refused_are_not_counted_lost(told: bool) -> None:
    """A batch the send buffer refused (EAGAIN) was numbered but never left: a gap, not a loss (when told)."""
    rc = RateControl(RateParams(initial_rate_bytes_per_s=50e6), 0.0)
    receiver = PeerFeedback(every=8)
    now, refused = 0.0, 0
    for batch in range(60):
        seqs = [rc.on_send(PACKET_BYTES, now) for _ in range(8)]
        if batch % 5 == 2:  # every fifth batch: the host's send buffer is full; it goes again, renumbered
            refused += len(seqs)
            if told:
                for seq in seqs:
                    rc.on_unsent(seq, now)
            continue
        now += 0.0002
        acks: list[Action] = []
        for seq in seqs:
            receiver.on_data(seq, False, now, acks)
        for ack in acks:
            assert isinstance(ack, Ack)
            rc.on_ack(ack.sent, ack.received, ack.ce, ack.echo, now + 0.0002)
        now += 0.001
    assert refused == 96
    if told:  # congestion in this host (cut, counted as refused), not loss
        assert rc.lost == 0 and rc.refused == refused and rc.decreases > 0
    else:  # what an untold gap looks like: every refused datagram counted lost
        assert rc.lost == refused and rc.refused == 0
