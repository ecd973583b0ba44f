"""UDP GSO sends and GRO reads over loopback (commsched.transport.dlcp.udp); skipped where the kernel lacks them."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from commsched.transport.dlcp import udp


@pytest.fixture
def two() -> Iterator[tuple[socket.socket, socket.socket]]:
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(2.0)
    yield sender, receiver
    sender.close()
    receiver.close()


def datagrams(count: int, size: int, tail: int) -> list[bytes]:
    """``count`` datagrams of ``size`` bytes, then one of ``tail`` bytes (0: none), each filled with its index."""
    out = [bytes([i]) * size for i in range(count)]
    return out + ([bytes([count]) * tail] if tail else [])


def test_batch_limit_keeps_a_gso_send_within_64_datagrams_and_one_ip_packet() -> None:
    assert udp.batch_limit(1000) == 64
    assert udp.batch_limit(1500) == 43  # 43 * 1500 <= 65507 < 44 * 1500
    assert udp.batch_limit(9000) == 7
    assert udp.batch_limit(70000) == 1


def test_a_gso_batch_reaches_a_plain_socket_as_separate_datagrams_with_the_short_one_last(two: tuple) -> None:
    sender, receiver = two
    if reason := udp.gso_supported(sender):
        pytest.skip(f"no UDP GSO here: {reason}")
    sent = datagrams(5, 1200, 77)
    udp.send_batch(sender, sent, 0xB8 | 2, 1200, receiver.getsockname())
    reader = udp.DatagramReader(receiver)
    got = []
    for _ in sent:
        n, segment, tos = reader.read()
        assert segment == n and tos == 0xBA
        got.append(bytes(reader.view[:n]))
    assert got == sent


def test_a_gro_socket_reads_a_batch_at_once_and_the_reader_cuts_it_at_the_segment_size(two: tuple) -> None:
    sender, receiver = two
    if (reason := udp.gso_supported(sender)) or (reason := udp.enable_gro(receiver)):
        pytest.skip(f"no UDP GSO/GRO here: {reason}")
    sent = datagrams(6, 1000, 10)
    udp.send_batch(sender, sent, 0, 1000, receiver.getsockname())
    reader = udp.DatagramReader(receiver)
    got: list[bytes] = []
    while len(got) < len(sent):
        n, segment, _tos = reader.read()
        got += [bytes(reader.view[i : min(i + segment, n)]) for i in range(0, n, segment)]
    assert got == sent


def test_without_segmentation_the_parts_make_one_datagram(two: tuple) -> None:
    sender, receiver = two
    udp.send_batch(sender, [b"head", memoryview(b"-payload-"), b"mac"], 0, 0, receiver.getsockname())
    reader = udp.DatagramReader(receiver)
    n, segment, _tos = reader.read()
    assert bytes(reader.view[:n]) == b"head-payload-mac" and segment == n


def test_an_empty_datagram_reads_as_zero_bytes_in_one_segment(two: tuple) -> None:
    sender, receiver = two
    sender.sendto(b"", receiver.getsockname())
    assert udp.DatagramReader(receiver).read()[:2] == (0, 0)


def test_a_socket_that_is_not_udp_refuses_the_options_with_a_reason() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert (udp.gso_supported(tcp) or "").startswith("UDP_SEGMENT")
        assert (udp.enable_gro(tcp) or "").startswith("UDP_GRO")
