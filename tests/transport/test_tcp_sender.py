"""The sending side of a TCP link's connection: frames whole and in order, written by the caller where they fit."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import torch

from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.transport.tcp import TcpTransfer
from commsched.transport.tcp_sender import PeerSender
from commsched.transport.wire import bytes_of, recv_exact

TIMEOUT_S = 10.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(TIMEOUT_S)  # non-blocking underneath, as the link's dialed connections are
    b.settimeout(TIMEOUT_S)
    yield a, b
    a.close()
    b.close()


def _sender(sock: socket.socket, failures: list[str]) -> tuple[PeerSender, threading.Thread]:
    sender = PeerSender(1, sock, failures.append)
    thread = daemon_thread(sender.run, "test-sender")
    thread.start()
    return sender, thread


def _transfer(i: int) -> TcpTransfer:
    return TcpTransfer(f"send {i}", TIMEOUT_S)


def test_a_frame_the_socket_takes_at_once_ends_in_the_callers_thread(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    sender, thread = _sender(a, [])
    t = _transfer(0)
    sender.send(b"head", bytes_of(torch.arange(4, dtype=torch.float32)), t)
    assert t.is_completed() and sender._queued == 0  # no thread was needed
    assert recv_exact(b, 4 + 16) == b"head" + torch.arange(4, dtype=torch.float32).numpy().tobytes()
    sender.stop()
    thread.join(TIMEOUT_S)


def test_frames_larger_than_the_socket_buffer_are_finished_by_the_thread_and_later_ones_wait_their_turn(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    sender, thread = _sender(a, [])
    big = torch.arange(1 << 22, dtype=torch.int32)  # 16 MiB: more than a socket buffer holds
    small = torch.full((3,), 7, dtype=torch.int32)
    transfers = [_transfer(i) for i in range(3)]
    sender.send(b"big0", bytes_of(big), transfers[0])
    assert not transfers[0].is_completed()  # the reader has not read: the rest is the thread's
    sender.send(b"sml1", bytes_of(small), transfers[1])
    sender.send(b"sml2", bytes_of(small), transfers[2])
    assert not transfers[2].is_completed()  # behind the big frame, not written before it
    got = recv_exact(b, 4 + big.numel() * 4 + 2 * (4 + 12))
    expected = b"big0" + big.numpy().tobytes() + (b"sml1" + small.numpy().tobytes())
    assert got == expected + b"sml2" + small.numpy().tobytes()
    for t in transfers:
        t.wait(TIMEOUT_S)
    assert sender._queued == 0
    sender.stop()
    thread.join(TIMEOUT_S)


def test_a_broken_connection_fails_the_transfers_naming_the_peer_and_tells_the_link(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    failures: list[str] = []
    sender, thread = _sender(a, failures)
    big, behind = _transfer(0), _transfer(1)
    sender.send(b"big0", bytes_of(torch.ones(1 << 22)), big)  # the thread writes the rest
    sender.send(b"sml1", bytes_of(torch.ones(3)), behind)
    b.close()  # mid-frame: the thread's write fails
    for t in (big, behind):
        with pytest.raises(RuntimeCommError, match=r"send \d: the connection to rank 1 failed"):
            t.wait(TIMEOUT_S)
    assert len(failures) == 1 and failures[0].startswith("the connection to rank 1 failed"), failures
    at_once = _transfer(2)  # and a frame sent after the failure fails without waiting
    sender.send(b"late", bytes_of(torch.ones(3)), at_once)
    with pytest.raises(RuntimeCommError, match="the connection to rank 1 failed"):
        at_once.wait(TIMEOUT_S)
    sender.stop()
    thread.join(TIMEOUT_S)


def test_a_connection_closed_before_the_first_write_fails_it_in_the_callers_thread(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.close()
    failures: list[str] = []
    sender, thread = _sender(a, failures)
    t = _transfer(0)
    sender.send(b"head", bytes_of(torch.ones(4)), t)
    assert t.is_completed()
    with pytest.raises(RuntimeCommError, match="send 0: the connection to rank 1 failed"):
        t.wait(0.0)
    assert len(failures) == 1, failures
    sender.stop()
    thread.join(TIMEOUT_S)
