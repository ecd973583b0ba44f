"""The sockets of a DLCP link: UDP for data (one per local path), TCP for control, bound only where told.

:class:`LinkSockets` binds one UDP socket per local address (``bind`` first,
then each of ``paths``) and one TCP listener on ``bind``, each on a port the
kernel picks; :attr:`LinkSockets.endpoints` is what peers need to reach them.
A UDP socket reports the TOS byte of each datagram it receives
(``IP_RECVTOS`` / ``IPV6_RECVTCLASS``), so a receiver sees ECN's CE mark, and
:func:`send_tos` sets the TOS byte per datagram (an ``IP_TOS`` control
message), so one socket carries every priority and importance class.

``SO_RCVBUF`` is sized to absorb a receiver stall (a GIL or GC pause) of
``stall_s`` at ``expected_rate_bytes_per_s``, twice over for the kernel's
per-datagram overhead; Linux caps it at ``net.core.rmem_max``, and the
sizes asked, granted and the cap are kept so a link can report the cap.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

#: One ``(host, port)`` address.
Address = tuple[str, int]

_RMEM_MAX = Path("/proc/sys/net/core/rmem_max")
MAX_FRAME_BYTES = 65536
_LEN = struct.Struct("!I")


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a rank listens: a UDP address per data path, and its control (TCP) address."""

    data: tuple[Address, ...]
    control: Address


def rmem_max_bytes() -> int | None:
    """The kernel's cap on ``SO_RCVBUF`` (``net.core.rmem_max``), or None where it cannot be read."""
    try:
        return int(_RMEM_MAX.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


class LinkSockets:
    """The bound sockets of one rank; :meth:`close` releases them."""

    __slots__ = ("control", "data", "endpoints", "rcvbuf_granted_bytes", "rcvbuf_requested_bytes", "rmem_max_bytes")

    def __init__(
        self,
        bind: str,
        paths: tuple[str, ...] = (),
        *,
        stall_s: float = 0.1,
        expected_rate_bytes_per_s: float = 1.25e9,
    ) -> None:
        hosts = [bind, *(p for p in paths if p != bind)]
        self.rcvbuf_requested_bytes = int(2 * stall_s * expected_rate_bytes_per_s)
        self.rmem_max_bytes = rmem_max_bytes()
        self.data: list[socket.socket] = []
        try:
            for host in hosts:
                family = _family(host)
                sock = socket.socket(family, socket.SOCK_DGRAM)
                self.data.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf_requested_bytes)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
                else:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
                sock.bind((host, 0))
                sock.setblocking(False)
            # Linux reports twice what it grants (the other half is its bookkeeping)
            self.rcvbuf_granted_bytes = self.data[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
            self.control = socket.socket(_family(bind), socket.SOCK_STREAM)
            self.control.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.control.bind((bind, 0))
            self.control.listen(64)
            self.control.setblocking(False)
        except BaseException:
            for sock in self.data:
                sock.close()
            raise
        self.endpoints = Endpoints(
            tuple((s.getsockname()[0], s.getsockname()[1]) for s in self.data),
            (self.control.getsockname()[0], self.control.getsockname()[1]),
        )

    @property
    def rcvbuf_limited(self) -> bool:
        """The kernel granted less receive buffer than asked for."""
        return self.rcvbuf_granted_bytes < self.rcvbuf_requested_bytes

    def close(self) -> None:
        for sock in (*self.data, self.control):
            with contextlib.suppress(OSError):
                sock.close()


_TOS_CACHE: dict[int, bytes] = {}


def send_tos(sock: socket.socket, datagram: bytes, tos: int, dest: Address) -> None:
    """Send one datagram with IP TOS (IPv6: traffic class) ``tos``; raises OSError (e.g. a full buffer)."""
    packed = _TOS_CACHE.get(tos)
    if packed is None:
        packed = _TOS_CACHE.setdefault(tos, struct.pack("i", tos))
    if sock.family == socket.AF_INET6:
        sock.sendmsg([datagram], [(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, packed)], 0, dest)
    else:
        sock.sendmsg([datagram], [(socket.IPPROTO_IP, socket.IP_TOS, packed)], 0, dest)


_CMSG_BYTES = socket.CMSG_SPACE(4)


def recv_tos(sock: socket.socket, buf: bytearray) -> tuple[int, int]:
    """One datagram into ``buf``: ``(bytes, TOS byte)``; raises BlockingIOError when none is waiting."""
    n, ancillary, _flags, _addr = sock.recvmsg_into([buf], _CMSG_BYTES)
    tos = 0
    for _level, _type, data in ancillary:
        if data:
            tos = data[0] if len(data) == 1 else int.from_bytes(data[:4], "little")
    return n, tos


def frame(message: bytes) -> bytes:
    """A control message on the TCP stream: a 4-byte length, then the message."""
    return _LEN.pack(len(message)) + message


class FrameReader:
    """Cuts a TCP byte stream into messages; never holds more than one frame and one read.

    A length of 0 or over :data:`MAX_FRAME_BYTES` raises ValueError (the
    connection is then to be closed: a stream out of step cannot resync).
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        frames = []
        while len(self._buf) >= _LEN.size:
            (length,) = _LEN.unpack_from(self._buf)
            if not 0 < length <= MAX_FRAME_BYTES:
                raise ValueError(f"control frame of {length} bytes")
            if len(self._buf) < _LEN.size + length:
                break
            frames.append(bytes(self._buf[_LEN.size : _LEN.size + length]))
            del self._buf[: _LEN.size + length]
        return frames
