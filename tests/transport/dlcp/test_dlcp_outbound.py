"""How a DlcpLink's datagrams leave and arrive: GSO/GRO batches, the fallbacks without them, and the MTU.

Two ranks in one process on 127.0.0.1 (one I/O thread each); every transfer
runs at bound 0 and must arrive bit-exact, however it was batched.
"""

from __future__ import annotations

import errno
import math
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _data_path import patches_data_path
from test_dlcp_link import KEY, data, eventually

import commsched.transport.dlcp.engine as dlcp_engine
import commsched.transport.dlcp.sockets as dlcp_sockets
import commsched.transport.dlcp.udp as dlcp_udp
from commsched.errors import SpecError
from commsched.transport.base import TransportOptions
from commsched.transport.dlcp.link import DlcpLink
from commsched.transport.dlcp.sockets import LinkSockets, path_mtu_problems
from commsched.transport.dlcp.wire import packet_numel
from commsched.transport.links import TransferKey

K = TransferKey


def pair(udp_offload: bool = True, **knobs: Any) -> list[DlcpLink]:
    sockets = [LinkSockets("127.0.0.1", udp_offload=udp_offload) for _ in range(2)]
    peers = [s.endpoints for s in sockets]
    return [DlcpLink(rank, 2, sockets[rank], peers, KEY, timeout_s=10.0, **knobs) for rank in range(2)]


@pytest.fixture
def closing() -> Iterator[list[DlcpLink]]:
    opened: list[DlcpLink] = []
    yield opened
    for link in opened:
        link.close()


def move(links: list[DlcpLink], numel: int, step: int = 0) -> torch.Tensor:
    """Send ``numel`` float32 from rank 0 to rank 1 at bound 0; check it arrived exactly; the data."""
    sent = data(numel, seed=step)
    out = torch.full_like(sent, float("nan"))
    recv = links[1].recv(0, K(step, 0, 0), out)
    send = links[0].send(1, K(step, 0, 0), sent)
    assert recv.wait(10.0).lost == 0
    send.wait(10.0)
    assert torch.equal(out, sent)
    return sent


def offload_granted() -> str | None:
    """Why this kernel gives no UDP GSO/GRO (None: it does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return dlcp_udp.gso_supported(sock) or dlcp_udp.enable_gro(sock)


def test_with_offload_datagrams_go_out_and_come_in_several_per_system_call(closing: list[DlcpLink]) -> None:
    if reason := offload_granted():
        pytest.skip(f"no UDP GSO/GRO here: {reason}")
    closing += pair()
    move(closing, 300_000)
    sender, receiver = closing[0].stats, closing[1].stats
    assert closing[0].offload == "GSO+GRO"
    assert sender.sent >= math.ceil(300_000 / packet_numel(1500, 4))
    # fewer calls than datagrams: some calls carried several (one each without offload, the next test);
    # how many per call follows the pacing, which a loaded machine changes, so no ratio is asserted
    assert sender.send_calls < sender.sent
    assert receiver.recv_calls < receiver.received
    assert receiver.rejected == {} and sender.gso_refused == 0


def test_without_offload_every_datagram_takes_its_own_system_call(closing: list[DlcpLink]) -> None:
    closing += pair(udp_offload=False)
    move(closing, 100_000)
    sender, receiver = closing[0].stats, closing[1].stats
    assert closing[0].offload == "off"
    assert sender.send_calls == sender.sent - sender.send_errors
    assert receiver.recv_calls == receiver.received


def test_a_kernel_without_gso_sends_one_datagram_per_call_and_says_why(
    closing: list[DlcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dlcp_sockets, "gso_supported", lambda sock: "UDP_SEGMENT: Protocol not available")
    closing += pair()
    move(closing, 100_000)
    assert closing[0].offload.endswith("(UDP_SEGMENT: Protocol not available)")
    assert "GSO" not in closing[0].offload.split(" ")[0]
    sender = closing[0].stats
    assert sender.send_calls == sender.sent - sender.send_errors and sender.gso_refused == 0


@patches_data_path
def test_a_route_that_refuses_a_gso_send_turns_gso_off_and_the_batch_goes_again_one_by_one(
    closing: list[DlcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    if reason := offload_granted():
        pytest.skip(f"no UDP GSO here: {reason}")
    original = dlcp_udp.send_batch
    refused = []

    def no_segmentation(sock: socket.socket, parts: Any, tos: int, segment_bytes: int, dest: Any) -> int:
        if segment_bytes:  # as a device without checksum offload answers
            refused.append(len(parts) // 3)
            raise OSError(errno.EIO, "Input/output error")
        return original(sock, parts, tos, segment_bytes, dest)

    monkeypatch.setattr(dlcp_udp, "send_batch", no_segmentation)
    closing += pair()
    move(closing, 200_000)
    move(closing, 50_000, step=1)
    sender = closing[0].stats
    assert len(refused) == 1 and refused[0] > 1  # refused once, then never asked again
    assert sender.gso_refused == 1 and closing[0]._engine.outbound.gso == [False]
    assert sender.send_calls == sender.sent - sender.send_errors


def test_jumbo_datagrams_carry_a_transfer_in_fewer_datagrams(closing: list[DlcpLink]) -> None:
    closing += pair(mtu_bytes=9000)
    move(closing, 200_000)
    per_datagram = packet_numel(9000, 4)
    assert per_datagram > 6 * packet_numel(1500, 4)
    assert closing[1].stats.written == math.ceil(200_000 / per_datagram)


def test_an_empty_datagram_is_refused_and_the_link_keeps_working(closing: list[DlcpLink]) -> None:
    closing += pair()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        attacker.sendto(b"", tuple(closing[1]._engine._peers[1].data[0]))
    assert eventually(lambda: sum(closing[1].stats.rejected.values()) == 1)
    move(closing, 10_000)


def test_path_mtu_problems_reads_the_route_mtu_toward_each_peer() -> None:
    sockets = [LinkSockets("127.0.0.1") for _ in range(2)]
    try:
        peers = [s.endpoints for s in sockets]
        assert path_mtu_problems(sockets[0], peers, 0, 9000) == []
        problems = path_mtu_problems(sockets[0], peers, 0, 70_000)  # loopback's MTU is 65536 on Linux
        assert len(problems) == 1 and "rank 0 -> rank 1, path 0" in problems[0] and "route MTU" in problems[0]
    finally:
        for s in sockets:
            s.close()


def test_a_link_refuses_an_mtu_over_its_routes_and_out_of_range_mtus(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"TransportOptions.mtu_bytes: .* got 100"):
        TransportOptions(mtu_bytes=100)
    with pytest.raises(ValueError, match="udp_offload"):
        TransportOptions(udp_offload="yes")  # type: ignore[arg-type]
    monkeypatch.setattr(dlcp_sockets, "_route_mtu", lambda local, host, port: 1400)
    sockets = [LinkSockets("127.0.0.1") for _ in range(2)]
    try:
        with pytest.raises(SpecError, match=r"mtu_bytes: datagrams of 1500 bytes would not fit the route MTU"):
            DlcpLink(0, 2, sockets[0], [s.endpoints for s in sockets], KEY)
    finally:
        for s in sockets:
            s.close()


def test_the_link_counts_the_turns_of_its_io_loop_and_those_a_timer_woke(closing: list[DlcpLink]) -> None:
    closing += pair()
    out = torch.empty(1000)
    recv = closing[1].recv(0, K(0, 0, 0), out)
    # a receive is pending and nothing arrives: the loop wakes on its millisecond timer with no socket ready
    assert eventually(lambda: closing[1].stats.idle_turns >= 5)
    sent = data(1000, seed=0)
    closing[0].send(1, K(0, 0, 0), sent).wait(10.0)
    assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
    stats = closing[1].stats
    assert stats.idle_turns < stats.turns  # the turns that read the datagrams are not idle


class _Selector:
    """A selector that notes the timeouts it is given and has a socket ready on the calls listed in ``ready``."""

    def __init__(self, ready: set[int]) -> None:
        self.timeouts: list[float] = []
        self.ready = ready

    def select(self, timeout: float) -> list[Any]:
        self.timeouts.append(timeout)
        return ["event"] if len(self.timeouts) in self.ready else []


@pytest.mark.parametrize(
    ("timeout_s", "ready", "selects", "slept"),
    [
        (0.0004, set(), [0, 0], [0.0004]),  # below epoll's millisecond: poll, sleep that long, poll again
        (0.0004, {1}, [0], []),  # a socket already ready: no sleep
        (0.003, set(), [0.003], []),  # a millisecond or more: epoll waits
        (0.0, set(), [0.0], []),
    ],
)
@patches_data_path
def test_the_io_loop_waits_less_than_epolls_millisecond_without_rounding_it_up(
    monkeypatch: pytest.MonkeyPatch, timeout_s: float, ready: set[int], selects: list[float], slept: list[float]
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(dlcp_engine.time, "sleep", sleeps.append)
    selector = _Selector(ready)
    engine = SimpleNamespace(_sel=selector)
    events = dlcp_engine.Engine._wait(engine, timeout_s)  # type: ignore[arg-type]
    assert selector.timeouts == selects and sleeps == slept
    assert events == (["event"] if ready else [])


@patches_data_path
def test_a_sender_waits_while_this_hosts_queue_holds_two_bursts_and_goes_on_once_it_drains(
    monkeypatch: pytest.MonkeyPatch, closing: list[DlcpLink]
) -> None:
    closing += pair(mtu_bytes=9000)
    a, b = closing
    limit = a._engine.outbound.host_queue_limit
    assert limit == 2 * 4 * 9000  # two pacer bursts of 4 datagrams of the MTU
    queued = {"bytes": limit}  # the host's queue full: nothing may go
    monkeypatch.setattr(dlcp_udp, "queued_bytes", lambda sock: queued["bytes"])
    sent, out = data(50_000, seed=3), torch.empty(50_000)
    recv = b.recv(0, K(0, 0, 0), out)
    send = a.send(1, K(0, 0, 0), sent)
    assert eventually(lambda: a.stats.host_queue_full >= 20)
    assert a.stats.sent == 0 and not send.is_completed()
    queued["bytes"] = limit - 1  # room for one datagram a turn: the transfer goes on, datagram by datagram
    assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
    send.wait(10.0)
    assert a.stats.send_calls >= a.stats.sent  # one datagram per turn: no GSO batch of several


def test_queued_bytes_reads_what_this_host_still_holds_of_a_sockets_datagrams(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x" * 1000, ("127.0.0.1", 9))  # loopback hands it on at once: nothing stays queued
        assert dlcp_udp.queued_bytes(sock) == 0

        def refused(*args: Any) -> bytes:
            raise OSError(errno.ENOTTY, "not a tty")

        monkeypatch.setattr(dlcp_udp.fcntl, "ioctl", refused)
        assert dlcp_udp.queued_bytes(sock) == 0  # a kernel that will not say: no limit from it
