"""The sending side of a TCP link's connection: frames whole and in order, written by the caller where they fit."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.transport.tcp import TcpTransfer
from commsched.transport.tcp_sender import PeerSender
from commsched.transport.wire import bytes_of, recv_exact

TIMEOUT_S = 10.0


@dataclass
class Wire:
    """A sender on one end of a socket pair (its thread running), the other end, and what it told the link."""

    sender: PeerSender
    far: socket.socket
    failures: list[str] = field(default_factory=list)


@pytest.fixture
def wire() -> Iterator[Wire]:
    near, far = socket.socketpair()
    near.settimeout(TIMEOUT_S)  # non-blocking underneath, as the link's dialed connections are
    far.settimeout(TIMEOUT_S)
    failures: list[str] = []
    sender = PeerSender(1, near, failures.append)
    thread = daemon_thread(sender.run, "test-sender")
    thread.start()
    yield Wire(sender, far, failures)
    sender.stop()
    thread.join(TIMEOUT_S)
    near.close()
    far.close()


def _transfer(i: int) -> TcpTransfer:
    return TcpTransfer(f"send {i}", TIMEOUT_S)


def test_a_frame_the_socket_takes_at_once_ends_in_the_callers_thread(wire: Wire) -> None:
    t = _transfer(0)
    wire.sender.send(b"head", bytes_of(torch.arange(4, dtype=torch.float32)), t)
    assert t.is_completed() and wire.sender._queued == 0  # no thread was needed
    assert recv_exact(wire.far, 4 + 16) == b"head" + torch.arange(4, dtype=torch.float32).numpy().tobytes()


def test_frames_larger_than_the_socket_buffer_are_finished_by_the_thread_and_later_ones_wait_their_turn(
    wire: Wire,
) -> None:
    big = torch.arange(1 << 22, dtype=torch.int32)  # 16 MiB: more than a socket buffer holds
    small = torch.full((3,), 7, dtype=torch.int32)
    transfers = [_transfer(i) for i in range(3)]
    wire.sender.send(b"big0", bytes_of(big), transfers[0])
    assert not transfers[0].is_completed()  # the reader has not read: the rest is the thread's
    wire.sender.send(b"sml1", bytes_of(small), transfers[1])
    wire.sender.send(b"sml2", bytes_of(small), transfers[2])
    assert not transfers[2].is_completed()  # behind the big frame, not written before it
    got = recv_exact(wire.far, 4 + big.numel() * 4 + 2 * (4 + 12))
    expected = b"big0" + big.numpy().tobytes() + (b"sml1" + small.numpy().tobytes())
    assert got == expected + b"sml2" + small.numpy().tobytes()
    for t in transfers:
        t.wait(TIMEOUT_S)
    assert wire.sender._queued == 0


def test_a_broken_connection_fails_the_transfers_naming_the_peer_and_tells_the_link(wire: Wire) -> None:
    big, behind = _transfer(0), _transfer(1)
    wire.sender.send(b"big0", bytes_of(torch.ones(1 << 22)), big)  # the thread writes the rest
    wire.sender.send(b"sml1", bytes_of(torch.ones(3)), behind)
    wire.far.close()  # mid-frame: the thread's write fails
    for t in (big, behind):
        with pytest.raises(RuntimeCommError, match=r"send \d: the connection to rank 1 failed"):
            t.wait(TIMEOUT_S)
    assert len(wire.failures) == 1 and wire.failures[0].startswith("the connection to rank 1 failed"), wire.failures
    at_once = _transfer(2)  # and a frame sent after the failure fails without waiting
    wire.sender.send(b"late", bytes_of(torch.ones(3)), at_once)
    with pytest.raises(RuntimeCommError, match="the connection to rank 1 failed"):
        at_once.wait(TIMEOUT_S)


def test_a_connection_closed_before_the_first_write_fails_it_in_the_callers_thread(wire: Wire) -> None:
    wire.far.close()
    t = _transfer(0)
    wire.sender.send(b"head", bytes_of(torch.ones(4)), t)
    assert t.is_completed()
    with pytest.raises(RuntimeCommError, match="send 0: the connection to rank 1 failed"):
        t.wait(0.0)
    assert len(wire.failures) == 1, wire.failures
