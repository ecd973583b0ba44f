"""Many DLCP datagrams per system call: UDP segmentation offload (GSO) out, receive offload (GRO) in.

**GSO** (``UDP_SEGMENT``, Linux 4.18+): one ``sendmsg`` carries datagrams
laid back to back, each ``segment_bytes`` long but the last (which may be
shorter); the kernel cuts them apart after the socket (in software, or in
the NIC) into datagrams of their own, each with its own IP and UDP headers,
each within the path MTU (a segment that would not fit fails the send with
EMSGSIZE: nothing is fragmented). DLCP datagrams are self-describing and
each carries its own MAC, so a receiver never needs to know they were sent
together. All the datagrams of one call share one destination and one TOS
byte: a caller batches only datagrams of one class to one path.

**GRO** (``UDP_GRO``, Linux 5.0+): a socket that asks for it may be handed
several datagrams of one flow in one read, back to back, with their segment
size in a control message. On loopback a GSO send arrives whole; over a
device the kernel merges datagrams only where the device does GRO. Datagrams
merged share the IP header's TOS byte (the kernel never merges across TOS
values), so one ECN mark describes them all.

Why: the data path was bound by per-datagram system calls. Over loopback on
the development machine (a VM, 2 vCPUs, loaded; ``/proc/self/task/*/schedstat``
CPU time per datagram of 1,470 bytes, 20,000 datagrams): one ``sendmsg`` per
datagram 8.6 µs, in GSO batches of 44 about 1.5-1.9 µs; one ``recvmsg`` per
datagram 6.6 µs, from GRO batches 0.5 µs. Inside DLCP's I/O loop, where a
sleeping receiver is woken for every datagram, a lone ``sendmsg`` cost the
sender 30-38 µs (``benchmarks/dlcp_datapath.py``; numbers from a loaded machine, to be
repeated on a quiet one).

Where the kernel or the socket lacks either option, :func:`enable_gro` and
:func:`gso_supported` say so once, at open, and the link sends and reads one
datagram per call; a device that refuses a GSO send later (EIO: no checksum
offload on the route; EINVAL, EOPNOTSUPP) turns GSO off for that socket, and
the caller sends the batch again datagram by datagram.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
import sys
import termios
from collections.abc import Sequence

#: Linux's option numbers (Python 3.11's socket module does not name them).
UDP_SEGMENT = int(getattr(socket, "UDP_SEGMENT", 103))
UDP_GRO = int(getattr(socket, "UDP_GRO", 104))
SOL_UDP = int(getattr(socket, "SOL_UDP", 17))
#: Datagrams one GSO send may carry (Linux's UDP_MAX_SEGMENTS: 64 before 6.x, 128 since).
MAX_SEGMENTS = 64
#: Bytes one GSO send may carry: the largest UDP payload of an IPv4 packet.
MAX_BATCH_BYTES = 65507
#: errno values with which a route refuses a GSO send it cannot segment: fall back to one datagram per call.
GSO_REFUSED = frozenset((errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT))
#: A read buffer holds the largest GRO batch (64 KiB) or any one datagram.
READ_BUFFER_BYTES = 65536 + 512

_CMSG_SPACE = socket.CMSG_SPACE(4)
_INT = struct.Struct("i")
_SEGMENT_CACHE: dict[int, bytes] = {}
_TOS_CACHE: dict[int, bytes] = {}


def gso_supported(sock: socket.socket) -> str | None:
    """None if ``sock`` takes ``UDP_SEGMENT``; else why not (the kernel's answer)."""
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)  # 0: the socket's default stays "no segmentation"
    except OSError as exc:
        return f"UDP_SEGMENT: {exc.strerror or exc}"
    return None


def enable_gro(sock: socket.socket) -> str | None:
    """Ask for GRO batches on ``sock``: None if granted, else why not."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError as exc:
        return f"UDP_GRO: {exc.strerror or exc}"
    return None


def batch_limit(datagram_bytes: int) -> int:
    """How many datagrams of ``datagram_bytes`` one GSO send may carry (at least 1)."""
    return max(1, min(MAX_SEGMENTS, MAX_BATCH_BYTES // max(1, datagram_bytes)))


def _tos_message(sock: socket.socket, tos: int) -> tuple[int, int, bytes]:
    packed = _TOS_CACHE.get(tos)
    if packed is None:
        packed = _TOS_CACHE.setdefault(tos, struct.pack("i", tos))
    if sock.family == socket.AF_INET6:
        return (socket.IPPROTO_IPV6, socket.IPV6_TCLASS, packed)
    return (socket.IPPROTO_IP, socket.IP_TOS, packed)


def send_batch(
    sock: socket.socket, parts: Sequence[bytes | memoryview], tos: int, segment_bytes: int, dest: tuple[str, int]
) -> int:
    """Send the datagrams whose bytes are ``parts`` (concatenated) to ``dest`` with TOS ``tos``.

    ``segment_bytes`` 0: ``parts`` make one datagram. Otherwise they make
    datagrams of ``segment_bytes`` each, the last possibly shorter, cut by the
    kernel (GSO). Returns the bytes sent; raises OSError as ``sendmsg`` does
    (BlockingIOError for a full send buffer; with GSO, an errno of
    :data:`GSO_REFUSED` where the route cannot segment).
    """
    ancillary = [_tos_message(sock, tos)]
    if segment_bytes:
        packed = _SEGMENT_CACHE.get(segment_bytes)
        if packed is None:
            packed = _SEGMENT_CACHE.setdefault(segment_bytes, struct.pack("=H", segment_bytes))
        ancillary.append((SOL_UDP, UDP_SEGMENT, packed))
    return sock.sendmsg(parts, ancillary, 0, dest)


class DatagramReader:
    """Reads one socket into a buffer of its own: one datagram, or one GRO batch, per call.

    :meth:`read` returns ``(nbytes, segment_bytes, tos)``: the datagrams
    are ``buffer[i : min(i + segment_bytes, nbytes)]`` for ``i`` in
    ``range(0, nbytes, segment_bytes)`` (one datagram: ``segment_bytes ==
    nbytes``). Raises BlockingIOError when nothing is waiting.
    """

    __slots__ = ("_ancillary_bytes", "buffer", "sock", "view")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray(READ_BUFFER_BYTES)
        self.view = memoryview(self.buffer)
        self._ancillary_bytes = 2 * _CMSG_SPACE  # TOS, and the GRO segment size

    def read(self) -> tuple[int, int, int]:
        n, ancillary, _flags, _addr = self.sock.recvmsg_into([self.buffer], self._ancillary_bytes)
        tos = 0
        segment = n
        for level, kind, data in ancillary:
            if level == SOL_UDP and kind == UDP_GRO:
                if len(data) >= 2:
                    size = int.from_bytes(data[:4] if len(data) >= 4 else data[:2], sys.byteorder)
                    if 0 < size < n:
                        segment = size
            elif data:
                tos = data[0] if len(data) == 1 else int.from_bytes(data[:4], sys.byteorder)
        return n, segment, tos


def queued_bytes(sock: socket.socket) -> int:
    """Bytes of ``sock``'s datagrams this host still holds (``SIOCOUTQ``: sent and not yet released, so in its
    qdisc or device queue; over a veth until the peer namespace's IP layer takes them), the queue TCP Small Queues
    limits for TCP; 0 where the kernel will not say."""
    try:
        return int(_INT.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(_INT.size)))[0])
    except OSError:
        return 0
