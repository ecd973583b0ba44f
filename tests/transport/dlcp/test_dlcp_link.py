"""DlcpLink on 127.0.0.1: two ranks in one process (one I/O thread each).

Receives start with ``out`` full of NaN, so an element the link did not
write is visible: every test checks that exactly the elements outside the
reported ``missing`` ranges were written, with the sender's values.
"""

from __future__ import annotations

import gc
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from _data_path import patches_data_path

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.transport.dlcp import link as link_module
from commsched.transport.dlcp import slots
from commsched.transport.dlcp.link import DlcpLink, _chunk_norms, small_mtu_warning
from commsched.transport.dlcp.sockets import LinkSockets
from commsched.transport.dlcp.wire import packet_numel
from commsched.transport.links import Link, Received, TransferKey

KEY = bytes(range(32))
K = TransferKey


Drop = Callable[[int, int], bool]


def pair(
    host: str = "127.0.0.1", paths: tuple[str, ...] = (), drop: Drop | None = None, **knobs: Any
) -> list[DlcpLink]:
    sockets = [LinkSockets(host, paths) for _ in range(2)]
    peers = [s.endpoints for s in sockets]
    return [
        DlcpLink(rank, 2, sockets[rank], peers, KEY, drop=drop if rank == 0 else None, **knobs) for rank in range(2)
    ]


@pytest.fixture
def links() -> Iterator[list[DlcpLink]]:
    pair_ = pair(timeout_s=10.0)
    yield pair_
    for link in pair_:
        link.close()


def data(numel: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(-(2**30), 2**30, (numel,), generator=g).to(dtype)


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False): the I/O threads run on their own."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def arrives_whole(a: DlcpLink, b: DlcpLink, numel: int) -> None:
    """Send ``numel`` float32 from ``a`` (rank 0) to ``b`` (rank 1) at bound 0; every element arrives."""
    sent = data(numel)
    out = torch.full_like(sent, float("nan"))
    recv = b.recv(0, K(0, 0, 0), out)
    a.send(1, K(0, 0, 0), sent).wait(10.0)
    assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)


def check_written(out: torch.Tensor, sent: torch.Tensor, got: Received) -> None:
    """Elements outside ``missing`` equal the sender's; inside, untouched (NaN)."""
    mask = torch.ones(out.numel(), dtype=torch.bool)
    for start, stop in got.missing:
        mask[start:stop] = False
        assert torch.isnan(out[start:stop]).all()
    assert torch.equal(out[mask], sent[mask])


def test_the_link_satisfies_the_link_protocol(links: list[DlcpLink]) -> None:
    link: Link = links[0]
    assert (link.rank, link.world) == (0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int8])
@pytest.mark.parametrize("numel", [1, 351, 352, 353, 100_003])
def test_tensors_arrive_intact_at_bound_zero(links: list[DlcpLink], dtype: torch.dtype, numel: int) -> None:
    sent = data(numel, dtype=dtype)
    out = torch.zeros(numel, dtype=dtype)
    recv = links[1].recv(0, K(0, 1, 0), out)
    send = links[0].send(1, K(0, 1, 0), sent, priority=2)
    assert recv.wait(10.0).missing == () and send.wait(10.0).missing == ()
    assert torch.equal(out, sent) and recv.is_completed() and send.is_completed()
    assert links[1].stats.records[-1].ended == "complete"


def test_an_empty_transfer_completes_at_once(links: list[DlcpLink]) -> None:
    assert links[1].recv(0, K(0, 0, 0), torch.empty(0)).wait(1.0).lost == 0
    assert links[0].send(1, K(0, 0, 0), torch.empty(0)).wait(1.0).lost == 0


def test_many_keys_both_ways_in_any_order_and_a_receive_posted_late(links: list[DlcpLink]) -> None:
    sends, recvs = [], []
    for task in range(6):
        for src, dst in ((0, 1), (1, 0)):
            sent = data(20_000 + task, seed=10 * task + src)
            out = torch.full_like(sent, float("nan"))
            sends.append(links[src].send(dst, K(3, task, src), sent, priority=task % 3))
            recvs.append((links[dst], src, K(3, task, src), out, sent))
    # the data lands before the receives are posted: it waits in the early buffer
    assert eventually(lambda: links[0].stats.early_buffered + links[1].stats.early_buffered > 0)
    waits = [(link.recv(src, key, out), out, sent) for link, src, key, out, sent in reversed(recvs)]
    for transfer, out, sent in waits:
        assert transfer.wait(10.0).lost == 0 and torch.equal(out, sent)
    for send in sends:
        send.wait(10.0)


def test_ended_transfers_leave_no_reference_cycles_behind(links: list[DlcpLink]) -> None:
    """A transfer and its slot do not refer to each other once it ended: with the collector off, nothing of them
    outlives the caller's last reference (a cycle per transfer was about 124 objects of garbage an iteration of
    the ``dlcp`` policy, for the collector's passes to find)."""

    def alive() -> list[object]:
        return [
            o for o in gc.get_objects() if isinstance(o, link_module.DlcpTransfer | slots.SendSlot | slots.RecvSlot)
        ]

    gc.collect()
    gc.disable()
    try:
        for step in range(3):
            for src, dst in ((0, 1), (1, 0)):
                sent = data(30_000, seed=step)
                out = torch.empty_like(sent)
                recv = links[dst].recv(src, K(step, 0, src), out)
                links[src].send(dst, K(step, 0, src), sent).wait(10.0)
                assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
        del recv
        assert eventually(lambda: not alive()), alive()
    finally:
        gc.enable()


def test_an_ended_transfer_calls_back_in_the_io_thread_and_the_callback_may_post_the_next(
    links: list[DlcpLink],
) -> None:
    a, b = links
    sent = data(50_000)
    out, out_next = torch.full((50_000,), float("nan")), torch.full((50_000,), float("nan"))
    first = b.recv(0, K(0, 1, 0), out)
    called: list[str] = []
    posted = []

    def post_next() -> None:  # as a chained task posts its next phase
        called.append(threading.current_thread().name)
        posted.append(b.recv(0, K(0, 2, 0), out_next))

    assert first.then(post_next)
    a.send(1, K(0, 1, 0), sent).wait(5.0)
    assert eventually(lambda: bool(posted))
    assert called == ["dlcp-io-1"] and first.is_completed()
    assert not first.then(lambda: called.append("late"))  # ended: nothing registered, nothing called
    check_written(out, sent, first.wait(0.0))
    a.send(1, K(0, 2, 0), sent).wait(5.0)
    check_written(out_next, sent, posted[0].wait(5.0))
    assert called == ["dlcp-io-1"]


def test_an_incast_of_three_senders_to_one_receiver_arrives_intact() -> None:
    world = 4
    sockets = [LinkSockets("127.0.0.1") for _ in range(world)]
    links = [DlcpLink(r, world, sockets[r], [s.endpoints for s in sockets], KEY, timeout_s=20.0) for r in range(world)]
    try:
        sents = {r: data(500_000, seed=r) for r in range(1, world)}
        outs = {r: torch.empty(500_000) for r in range(1, world)}
        recvs = {r: links[0].recv(r, K(0, 0, 0), outs[r]) for r in range(1, world)}
        sends = [links[r].send(0, K(0, 0, 0), sents[r]) for r in range(1, world)]
        for r, recv in recvs.items():
            assert recv.wait(20.0).lost == 0 and torch.equal(outs[r], sents[r])
        for send in sends:
            send.wait(20.0)
    finally:
        for link in links:
            link.close()


def test_dropped_datagrams_are_resent_until_complete_at_bound_zero() -> None:
    rng = random.Random(3)
    a, b = pair(drop=lambda _peer, _offset: rng.random() < 0.2, timeout_s=10.0)
    try:
        arrives_whole(a, b, 200_000)
        assert a.stats.dropped_by_hook > 0 and a.stats.resent >= a.stats.dropped_by_hook
    finally:
        a.close()
        b.close()


@patches_data_path
def test_a_datagram_lost_on_the_wire_is_resent_on_the_receivers_report_before_any_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A datagram lost after it was numbered leaves a gap the receiver sees: its report, not a PROBE at the
    transfer's end, gets the hole re-sent (the PROBE is held off for the test's length)."""
    real = slots.SenderState
    monkeypatch.setattr(slots, "SenderState", lambda *a, **k: real(*a, **k, probe_delay_s=60.0))
    a, b = pair(timeout_s=10.0)
    transmit = a._engine.outbound._transmit
    lost: list[int] = []

    def lossy(slot: Any, numbered: list[Any], now: float) -> None:  # the 5th datagram, first sent, never arrives
        if not lost and a.stats.sent + len(numbered) >= 5:
            lost.append(numbered.pop(min(len(numbered) - 1, 4 - a.stats.sent))[1].offset)
        if numbered:
            transmit(slot, numbered, now)

    monkeypatch.setattr(a._engine.outbound, "_transmit", lossy)
    try:
        arrives_whole(a, b, 200_000)
        assert len(lost) == 1 and b.stats.reports >= 1 and a.stats.resent_on_report == 1
        # the report, not a PROBE, got the hole re-sent (besides what a full send buffer refused: it goes again)
        assert a.stats.probes == 0 and a.stats.resent == 1 + a.stats.send_errors
    finally:
        a.close()
        b.close()


@patches_data_path
def test_a_push_goes_before_a_pull_whatever_their_classes_and_no_send_before_an_earlier_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registered in one turn: a push of the least urgent class leaves before a pull of the most urgent (the
    peer's pull of that slice waits for it), and the next step's push after both."""
    a, b = pair(timeout_s=10.0)
    transmit = a._engine.outbound._transmit
    order: list[tuple[int, int, int]] = []

    def noted(slot: Any, numbered: list[Any], now: float) -> None:
        if not order or order[-1] != (slot.key.step, slot.key.phase, slot.prio):
            order.append((slot.key.step, slot.key.phase, slot.prio))
        transmit(slot, numbered, now)

    monkeypatch.setattr(a._engine.outbound, "_transmit", noted)
    try:
        # (key, class): a pull, the next step's push, a push
        posts = [(K(0, 0, 1), 0), (K(1, 1, 0), 0), (K(0, 1, 0), 3)]
        sent = [data(50_000, seed=i) for i in range(len(posts))]
        outs = [torch.full_like(x, float("nan")) for x in sent]
        recvs = [b.recv(0, key, out) for (key, _), out in zip(posts, outs, strict=True)]
        with a._engine._lock:  # every post waits for the I/O thread's next turn
            sends = [a.send(1, key, x, priority=prio) for (key, prio), x in zip(posts, sent, strict=True)]
        for recv, send in zip(recvs, sends, strict=True):
            assert recv.wait(10.0).lost == 0
            send.wait(10.0)
        assert all(torch.equal(out, x) for out, x in zip(outs, sent, strict=True))
        firsts = list(dict.fromkeys(order))  # (step, phase, class) in the order their first datagrams left
        assert firsts == [(0, 0, 3), (0, 1, 0), (1, 0, 0)]
    finally:
        a.close()
        b.close()


@patches_data_path
def test_control_messages_get_through_as_datagrams_while_the_control_connection_is_stalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lost TCP segment holds the control connection for a retransmission timeout: the datagram copies of
    STOP, PROBE and BITMAP, and the ACKs (datagrams only), carry the transfer meanwhile."""
    rng = random.Random(7)
    a, b = pair(drop=lambda _peer, _offset: rng.random() < 0.1, timeout_s=10.0)
    try:
        for link in (a, b):
            monkeypatch.setattr(link._engine._control, "send", lambda peer, message: None)  # nothing on TCP
        sent = data(100_000)
        out = torch.full_like(sent, float("nan"))
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent).wait(5.0)
        assert recv.wait(5.0).lost == 0 and torch.equal(out, sent)
        assert a.stats.probes > 0 and b.stats.bitmaps > 0  # the losses were recovered by datagrams alone
        assert a.stats.control_sent == b.stats.control_sent == 0
        assert b.stats.control_datagrams_sent > 0 and a.stats.control_received > 0
        assert a.rate_counters()[1]["rounds"] > 0  # the ACKs, datagrams only, fed the rate control
    finally:
        a.close()
        b.close()


@patches_data_path
def test_with_every_control_datagram_lost_the_tcp_copies_finish_the_transfer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*_args: Any) -> int:
        raise OSError("no route")

    a, b = pair(timeout_s=10.0)
    try:
        for link in (a, b):
            monkeypatch.setattr(link._engine, "_send_control_datagram", refused)
        sent = data(30_000)
        out = torch.full_like(sent, float("nan"))
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent).wait(5.0)
        assert recv.wait(5.0).lost == 0 and torch.equal(out, sent)
        assert b.stats.control_datagrams_sent == 0 and b.stats.control_sent > 0
    finally:
        a.close()
        b.close()


def test_the_second_copy_of_a_stop_counts_as_a_duplicate_not_a_stranger(links: list[DlcpLink]) -> None:
    a, b = links
    for i in range(3):
        sent = data(5_000, seed=i)
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, i, 0), out)
        a.send(1, K(0, i, 0), sent).wait(5.0)
        recv.wait(5.0)
    assert eventually(lambda: a.stats.control_duplicate == 3)  # each STOP came as a datagram and over TCP
    assert a.stats.control_unmatched == 0


@pytest.mark.parametrize("bound", [0.01, 0.05, 0.3])
def test_with_losses_a_bounded_receive_ends_within_its_bound_and_says_what_is_missing(bound: float) -> None:
    rng = random.Random(5)
    a, b = pair(drop=lambda _peer, _offset: rng.random() < 0.1, timeout_s=10.0)
    try:
        sent = data(300_001)
        out = torch.full_like(sent, float("nan"))
        recv = b.recv(0, K(1, 2, 1), out, loss_bound=bound)
        send = a.send(1, K(1, 2, 1), sent)
        got = recv.wait(10.0)
        send.wait(10.0)
        assert got.lost <= int(bound * sent.numel())
        check_written(out, sent, got)
        record = b.stats.records[-1]
        assert (record.lost_numel, record.numel) == (got.lost, sent.numel())
        assert record.ended in ("bound", "complete")
    finally:
        a.close()
        b.close()


def test_a_receiver_stall_longer_than_its_buffer_costs_no_loss_the_window_holds_the_sender() -> None:
    a, b = pair(timeout_s=20.0)
    try:
        sent = data(4_000_000)  # 16 MB: four times the 4 MiB receive buffer Linux grants by default
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        send = a.send(1, K(0, 0, 0), sent)
        time.sleep(0.05)
        with b._engine._lock:  # the receiver's I/O thread stalls (as in a long GC pause)
            time.sleep(0.3)
        assert recv.wait(20.0).lost == 0 and torch.equal(out, sent)
        send.wait(20.0)
        assert a.stats.resent <= 0.05 * a.stats.sent
    finally:
        a.close()
        b.close()


def test_a_wait_that_runs_out_cancels_and_nothing_is_written_after(links: list[DlcpLink]) -> None:
    out = torch.full((5000,), float("nan"))
    recv = links[1].recv(0, K(0, 0, 0), out)
    with pytest.raises(RuntimeCommError, match="cancelled"):
        recv.wait(0.1)
    assert links[1].stats.records[-1].ended == "cancelled"
    links[0].send(1, K(0, 0, 0), data(5000)).wait(5.0)  # the receiver already ended: its STOP ends the send
    assert torch.isnan(out).all()


def test_the_deadline_ends_a_receive_that_cannot_reach_its_bound() -> None:
    a, b = pair(timeout_s=0.3)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeCommError, match="deadline"):
            b.recv(0, K(0, 0, 0), torch.empty(1000)).wait()
        assert time.monotonic() - start < 2.0
        assert b.stats.records[-1].ended == "deadline"
    finally:
        a.close()
        b.close()


def test_early_data_beyond_the_buffer_is_dropped_then_recovered_by_probes() -> None:
    a, b = pair(timeout_s=10.0, early_limit_bytes=50_000)
    try:
        sent = data(100_000)
        send = a.send(1, K(0, 0, 0), sent)
        assert eventually(lambda: b.stats.early_dropped > 0)
        assert b._engine.inbound.early_bytes <= 50_000
        out = torch.full_like(sent, float("nan"))
        assert b.recv(0, K(0, 0, 0), out).wait(10.0).lost == 0 and torch.equal(out, sent)
        send.wait(10.0)
    finally:
        a.close()
        b.close()


def test_stale_steps_are_dropped(links: list[DlcpLink]) -> None:
    out = torch.empty(10)
    recv = links[1].recv(0, K(10, 0, 0), out)
    old = links[0].send(1, K(1, 0, 0), data(1000))  # 9 steps behind the newest receive
    assert eventually(lambda: links[1].stats.stale > 0)
    assert links[1].stats.early_buffered == 0
    links[0].send(1, K(10, 0, 0), data(10))
    assert recv.wait(5.0).lost == 0
    with pytest.raises(RuntimeCommError):
        old.wait(0.05)


def test_binding_honours_the_addresses_given_and_packets_cross_every_path() -> None:
    a, b = pair(host="127.0.0.2", paths=("127.0.0.3",), timeout_s=10.0)
    try:
        for link in (a, b):
            endpoints = link._engine._peers[link.rank]
            assert [host for host, _ in endpoints.data] == ["127.0.0.2", "127.0.0.3"]
            assert endpoints.control[0] == "127.0.0.2"
        sent = data(50_000)
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent).wait(10.0)
        assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
        per_path = b.stats.received_per_path
        assert len(per_path) == 2 and min(per_path) >= 0.45 * sum(per_path)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # nothing listens on 127.0.0.1 there
            assert probe.connect_ex(("127.0.0.1", b._engine._peers[1].control[1])) != 0
    finally:
        a.close()
        b.close()


def test_important_packets_arrive_ecn_capable_and_the_rest_not() -> None:
    a, b = pair(timeout_s=10.0, quantile=0.75)
    try:
        stride = packet_numel(1500, 4)
        small = torch.rand(30 * stride, generator=torch.Generator().manual_seed(1)) * 1e-3
        sent = torch.cat([small, torch.full((10 * stride,), 5.0)])  # 40 packets; the top quarter are the large
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent, priority=3).wait(5.0)  # layer class 3: importance by magnitude alone
        assert recv.wait(5.0).lost == 0 and torch.equal(out, sent)
        assert (b.stats.written, b.stats.ecn_capable, b.stats.ce_marked) == (40, 10, 0)
    finally:
        a.close()
        b.close()


def test_ipv6_loopback_works_too() -> None:
    try:
        a, b = pair(host="::1", timeout_s=10.0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        sent = data(30_000)
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent).wait(10.0)
        assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
        assert b.stats.ecn_capable > 0
    finally:
        a.close()
        b.close()


def test_bad_arguments_are_refused(links: list[DlcpLink]) -> None:
    with pytest.raises(ValueError, match="rank"):
        links[0].send(0, K(0, 0, 0), torch.zeros(3))
    with pytest.raises(UnsupportedError):
        links[0].send(1, K(0, 0, 0), torch.zeros(3, 3))
    with pytest.raises(UnsupportedError):
        links[0].send(1, K(0, 0, 0), torch.zeros(3, dtype=torch.complex64))
    links[1].recv(0, K(0, 0, 0), torch.zeros(3))
    with pytest.raises(ValueError, match="already"):
        links[1].recv(0, K(0, 0, 0), torch.zeros(3))


def test_close_is_bounded_and_fails_what_is_pending() -> None:
    a, b = pair(timeout_s=30.0)
    recv = b.recv(0, K(0, 0, 0), torch.empty(100))
    send = a.send(1, K(0, 1, 0), data(100))
    start = time.monotonic()
    a.close()
    b.close()
    assert time.monotonic() - start < 5.0
    for transfer in (recv, send):
        with pytest.raises(RuntimeCommError, match="closed"):
            transfer.wait(1.0)


class _HeldIoThread:
    """Holds ``link``'s I/O thread (its lock) until :meth:`release`; :meth:`join` is True if the lock was still
    held when released, so that what the test did before did not wait for the lock."""

    def __init__(self, link: DlcpLink) -> None:
        self._held, self._release, self._seen = threading.Event(), threading.Event(), list[bool]()
        self._thread = threading.Thread(target=self._hold, args=(link._engine._lock,))
        self._thread.start()
        assert self._held.wait(5.0)

    def _hold(self, lock: threading.Lock) -> None:
        with lock:
            self._held.set()
            self._seen.append(self._release.wait(10.0))

    def release(self, after_s: float = 0.0) -> None:
        threading.Timer(after_s, self._release.set).start()

    def join(self) -> bool:
        self._thread.join(10.0)
        return self._seen == [True]


def test_a_post_does_not_wait_for_the_io_threads_lock(links: list[DlcpLink]) -> None:
    held = _HeldIoThread(links[1])
    out = torch.full((5000,), float("nan"))
    recv = links[1].recv(0, K(0, 0, 0), out)  # the I/O thread is held: the receive is only queued
    with pytest.raises(ValueError, match="already posted"):  # a second post of a queued key is refused at once
        links[1].recv(0, K(0, 0, 0), torch.empty(5000))
    held.release()
    assert held.join()
    sent = data(5000)
    links[0].send(1, K(0, 0, 0), sent).wait(5.0)
    assert recv.wait(5.0).lost == 0 and torch.equal(out, sent)


def test_a_receive_cancelled_while_queued_ends_like_any_cancelled_receive(links: list[DlcpLink]) -> None:
    held = _HeldIoThread(links[1])
    out = torch.full((5000,), float("nan"))
    recv = links[1].recv(0, K(0, 0, 0), out)
    held.release(after_s=0.2)  # the lock comes free during the wait's cancel
    with pytest.raises(RuntimeCommError, match="cancelled"):
        recv.wait(0.05)
    assert held.join()
    # whichever took the lock first (the I/O thread or the cancel), the receive was registered and cancelled:
    assert links[1].stats.records[-1].ended == "cancelled" and not links[1]._engine._posted
    links[0].send(1, K(0, 0, 0), data(5000)).wait(5.0)  # its STOP ends the peer's send
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match="already posted"):  # and its key counts as used
        links[1].recv(0, K(0, 0, 0), torch.empty(5000))


@pytest.mark.parametrize("numel", [1, 2249, 2250, 2251, 10_000])
def test_chunk_norms_match_the_norms_of_the_zero_padded_chunks(numel: int) -> None:
    values = data(numel, seed=numel)
    padded = torch.nn.functional.pad(values, (0, -numel % 2250)).view(-1, 2250)
    assert torch.allclose(torch.from_numpy(_chunk_norms(values, 2250)), torch.linalg.vector_norm(padded, dim=1))
    assert torch.allclose(torch.from_numpy(_chunk_norms(values.half(), 2250)),
                          torch.linalg.vector_norm(padded.half().float(), dim=1), rtol=1e-3)  # fmt: skip


def test_front_layer_sends_lossless_receives_and_quantile_zero_skip_the_norms_every_packet_important(
    links: list[DlcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, str]] = []

    def norms(t: torch.Tensor, stride: int) -> np.ndarray:
        seen.append((t.numel(), threading.current_thread().name))
        return _chunk_norms(t, stride)

    monkeypatch.setattr("commsched.transport.dlcp.link._chunk_norms", norms)
    for priority, key, bound in ((0, 0, None), (3, 1, None), (3, 2, 0.0), (3, 3, 0.5)):
        out = torch.empty(5000)
        recv = links[1].recv(0, K(0, key, 0), out, loss_bound=bound or 0.0)
        send = links[0].send(1, K(0, key, 0), data(5000), priority=priority, loss_bound=bound)
        assert recv.wait(5.0).lost == 0
        send.wait(5.0)
    # only the back layer's sends to a receive that may lose some classified their chunks, on the I/O thread:
    # posting a send costs the caller no pass over its data
    assert seen == [(5000, "dlcp-io-0")] * 2
    assert links[1].stats.ecn_capable < links[1].stats.written  # their unimportant packets: not ECN-capable
    every = pair(timeout_s=10.0, quantile=0.0)
    try:
        recv = every[1].recv(0, K(0, 0, 0), torch.empty(5000))
        every[0].send(1, K(0, 0, 0), data(5000), priority=3).wait(5.0)
        assert recv.wait(5.0).lost == 0
    finally:
        for link in every:
            link.close()
    assert len(seen) == 2  # quantile 0: every packet important, no norms either


@pytest.mark.parametrize("bound", [-0.1, 1.5, float("nan")])
def test_a_send_refuses_a_loss_bound_out_of_range_at_once(links: list[DlcpLink], bound: float) -> None:
    with pytest.raises(ValueError, match="send loss_bound must be in"):
        links[0].send(1, K(0, 0, 0), data(100), priority=3, loss_bound=bound)


def test_a_lossless_receives_packets_all_arrive_ecn_capable() -> None:
    """A receive that takes every packet has none to be dropped first: its sender marks them all important
    (ECN-capable, first served), as the packet-level simulator does."""
    a, b = pair(timeout_s=10.0, quantile=0.75)
    try:
        stride = packet_numel(1500, 4)
        small = torch.rand(30 * stride, generator=torch.Generator().manual_seed(1)) * 1e-3
        sent = torch.cat([small, torch.full((10 * stride,), 5.0)])
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        a.send(1, K(0, 0, 0), sent, priority=3, loss_bound=0.0).wait(5.0)
        assert recv.wait(5.0).lost == 0 and torch.equal(out, sent)
        assert (b.stats.written, b.stats.ecn_capable) == (40, 40)
    finally:
        a.close()
        b.close()


def test_small_datagrams_are_warned_about_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below jumbo frames the data path's rate per core, not the link, bounds a transfer: the user is told
    what to do (jumbo frames, or ps), once."""
    said = small_mtu_warning(1500)
    assert said is not None and "1500 bytes" in said and "mtu_bytes=9000" in said and "policy='ps'" in said
    assert small_mtu_warning(9000) is None and small_mtu_warning(link_module.SMALL_MTU_BYTES) is None
    monkeypatch.setattr(link_module, "_warned_small_mtu", False)
    with caplog.at_level("WARNING", logger="commsched"):
        made = pair(timeout_s=10.0) + pair(timeout_s=10.0)
    for link in made:
        link.close()
    assert [r.getMessage() for r in caplog.records if "datagrams of 1500 bytes" in r.getMessage()] == [said]


def test_a_detached_send_goes_on_from_a_copy_while_its_caller_changes_the_tensor() -> None:
    """Detached at once, a send reads nothing more of its tensor: the receiver gets what it held then, the
    datagram lost first and re-sent (on the PROBE) included."""
    dropped: list[int] = []

    def drop_once(_peer: int, offset: int) -> bool:
        if dropped or offset == 0:
            return False
        dropped.append(offset)
        return True

    a, b = pair(drop=drop_once, timeout_s=10.0)
    try:
        sent = data(100_000, seed=7)
        expected = sent.clone()
        out = torch.empty_like(sent)
        recv = b.recv(0, K(0, 0, 0), out)
        detached: list[bool] = []

        def detach_and_change() -> None:  # in a's I/O thread, which ends the small receive below
            detached.append(send.detach())
            sent.fill_(float("nan"))  # the caller's tensor changes at once

        with a._engine._lock:  # a's I/O thread waits: the detach comes before most of the send
            send = a.send(1, K(0, 0, 0), sent)
            assert not send.detach()  # not the I/O thread: cannot detach (it might wait on this thread's locks)
            signal = a.recv(1, K(0, 1, 0), torch.empty(4))
            assert signal.then(detach_and_change)
        b.send(0, K(0, 1, 0), torch.ones(4)).wait(10.0)
        assert recv.wait(10.0).lost == 0 and torch.equal(out, expected)
        send.wait(10.0)
        assert detached == [True] and len(dropped) == 1 and a.stats.resent >= 1
        assert send.detach()  # an ended send: nothing to do
    finally:
        a.close()
        b.close()
