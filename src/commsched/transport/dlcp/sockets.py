"""The sockets of a DLCP link: UDP for data (one per local path), TCP for control, bound only where told.

:class:`LinkSockets` binds one UDP socket per local address (``bind`` first,
then each of ``paths``) and one TCP listener on ``bind``, each on a port the
kernel picks; :attr:`LinkSockets.endpoints` is what peers need to reach them.
A UDP socket reports the TOS byte of each datagram it receives
(``IP_RECVTOS`` / ``IPV6_RECVTCLASS``), so a receiver sees ECN's CE mark, and
a sender sets the TOS byte per send (an ``IP_TOS`` control message,
:func:`~commsched.transport.dlcp.udp.send_batch`), so one socket carries
every priority and importance class.

``SO_RCVBUF`` is sized to absorb a receiver stall (a GIL or GC pause) of
``stall_s`` at ``expected_rate_bytes_per_s``, twice over for the kernel's
per-datagram overhead; Linux caps it at ``net.core.rmem_max``, and the
sizes asked, granted and the cap are kept so a link can report the cap.

Every data socket sends with the don't-fragment rule (``IP_PMTUDISC_DO``,
IPv6 ``IPV6_PMTUDISC_DO``): a datagram larger than the path MTU fails its
send with EMSGSIZE instead of leaving as IP fragments (one lost fragment
would lose the datagram). With ``udp_offload`` (the default) each data
socket is also asked for UDP GSO and GRO (:mod:`~commsched.transport.dlcp.udp`);
what the kernel granted is in :attr:`LinkSockets.gso` and
:attr:`LinkSockets.gro`, and why not in :attr:`LinkSockets.offload_refused`.
:func:`path_mtu_problems` compares a datagram size with the MTU of the
routes toward the peers, so a link can refuse a size too large at open.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from commsched.errors import SpecError
from commsched.transport.dlcp.udp import enable_gro, gso_supported

#: One ``(host, port)`` address.
Address = tuple[str, int]

_RMEM_MAX = Path("/proc/sys/net/core/rmem_max")
MAX_FRAME_BYTES = 65536
_LEN = struct.Struct("!I")
# Linux's option numbers (Python 3.11's socket module names none of them)
_IP_MTU_DISCOVER, _IP_MTU, _IPV6_MTU_DISCOVER, _IPV6_MTU, _PMTUDISC_DO = 10, 14, 23, 24, 2


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

    __slots__ = ("control", "data", "endpoints", "gro", "gso", "offload_refused", "rcvbuf_granted_bytes",
                 "rcvbuf_requested_bytes", "rmem_max_bytes")  # fmt: skip

    def __init__(
        self,
        bind: str,
        paths: tuple[str, ...] = (),
        *,
        stall_s: float = 0.1,
        expected_rate_bytes_per_s: float = 1.25e9,
        udp_offload: bool = True,
    ) -> None:
        hosts = [bind, *(p for p in paths if p != bind)]
        self.rcvbuf_requested_bytes = int(2 * stall_s * expected_rate_bytes_per_s)
        self.rmem_max_bytes = rmem_max_bytes()
        self.data: list[socket.socket] = []
        #: per data socket: the kernel takes UDP GSO sends / hands out GRO batches
        self.gso: list[bool] = []
        self.gro: list[bool] = []
        #: why an offload asked for was not granted (empty: granted, or not asked for)
        self.offload_refused: list[str] = []
        try:
            for host in hosts:
                family = _family(host)
                sock = socket.socket(family, socket.SOCK_DGRAM)
                self.data.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf_requested_bytes)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
                    sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_MTU_DISCOVER, _PMTUDISC_DO)
                else:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
                    sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _PMTUDISC_DO)
                refused = [r for r in (gso_supported(sock), enable_gro(sock)) if r] if udp_offload else []
                self.gso.append(udp_offload and not any(r.startswith("UDP_SEGMENT") for r in refused))
                self.gro.append(udp_offload and not any(r.startswith("UDP_GRO") for r in refused))
                self.offload_refused += [r for r in refused if r not in self.offload_refused]
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


def path_mtu_problems(sockets: LinkSockets, peers: Sequence[Endpoints], rank: int, datagram_bytes: int) -> list[str]:
    """Where a datagram of ``datagram_bytes`` (IP and UDP headers included) would not fit the route MTU from
    this rank's data sockets to each peer's data addresses (path by path); [] if it fits everywhere.

    Reads the MTU the kernel's route gives (``IP_MTU`` / ``IPV6_MTU`` of a
    socket connected there, nothing sent); a route it cannot read is not a
    problem (the first send would fail instead).
    """
    problems = []
    for peer, endpoints in enumerate(peers):
        if peer == rank:
            continue
        for path, (host, port) in enumerate(endpoints.data):
            local = sockets.data[path % len(sockets.data)].getsockname()[0]
            mtu = _route_mtu(local, host, port)
            if mtu is not None and datagram_bytes > mtu:
                problems.append(f"rank {rank} -> rank {peer}, path {path} ({local} -> {host}): route MTU {mtu}")
    return problems


def _route_mtu(local: str, host: str, port: int) -> int | None:
    family = _family(host)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((local, 0))
            probe.connect((host, port))
            if family == socket.AF_INET6:
                return int(probe.getsockopt(socket.IPPROTO_IPV6, _IPV6_MTU))
            return int(probe.getsockopt(socket.IPPROTO_IP, _IP_MTU))
    except OSError:
        return None


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


def offload_report(sockets: LinkSockets) -> str:
    """What the kernel granted of UDP GSO and GRO on ``sockets``: "GSO+GRO", "GSO", "GRO" or "off", and why not."""
    granted = [name for name, flags in (("GSO", sockets.gso), ("GRO", sockets.gro)) if flags and all(flags)]
    report = "+".join(granted) or "off"
    return f"{report} ({'; '.join(sockets.offload_refused)})" if sockets.offload_refused else report


def mtu_error(mtu_bytes: int, problems: list[str]) -> SpecError:
    """The error that refuses ``mtu_bytes`` for the routes :func:`path_mtu_problems` found too small."""
    return SpecError("TransportOptions", [
        f"mtu_bytes: datagrams of {mtu_bytes} bytes would not fit the route MTU ({problem}) and would be "
        f"fragmented; give at most the smallest route MTU, got {mtu_bytes}" for problem in problems
    ])  # fmt: skip
