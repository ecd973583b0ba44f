"""What :class:`~commsched.transport.tcp.TcpLink` puts on a TCP connection: the handshake and the frames.

Handshake (HMAC-SHA256 under the job's key, proven in both directions; the
connection then carries frames from the dialer to the listener only)::

    listener -> dialer   HELLO, nonce_L (32 bytes)
    dialer -> listener   nonce_D (32), rank_D (u32), HMAC(key, "dial" | nonce_L | nonce_D | rank_D, rank_L)
    listener -> dialer   HMAC(key, "listen" | nonce_D | nonce_L | rank_D, rank_L)

Fresh nonces on both sides keep a recorded handshake from being replayed.

Frame: :data:`HEADER` (magic, payload bytes, ``TransferKey`` step/task/phase,
dtype code of :data:`DTYPES`, numel; network byte order), then the payload:
the tensor's bytes as they lie in memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import secrets
import socket
import struct
import termios

import torch

from commsched.errors import RuntimeCommError

HELLO = b"commsched-link/1"
NONCE_BYTES = 32
DIAL = struct.Struct("!32sI32s")  # dialer's nonce, dialer's rank, MAC
HEADER = struct.Struct("!4sQqqqBQ")  # magic, payload bytes, step, task, phase, dtype code, numel
MAGIC = b"CSF1"
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.float64, 3: torch.float16, 4: torch.bfloat16,
    5: torch.int64, 6: torch.int32, 7: torch.int16, 8: torch.int8, 9: torch.uint8,
}  # fmt: skip
CODES: dict[torch.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}


def default_bind_address() -> str:
    """The local address this host uses to reach ``MASTER_ADDR`` (the route gloo's peers see), else the
    address the host name resolves to (what gloo itself binds to without ``GLOO_SOCKET_IFNAME``)."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(master, int(os.environ.get("MASTER_PORT", "1")))[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)  # a UDP "connect" sends nothing: it only picks the route
                return str(s.getsockname()[0])
        except (OSError, ValueError):
            pass
    return socket.gethostbyname(socket.gethostname())


#: What ``FIONREAD`` fills in: the bytes a socket holds unread.
_FIONREAD_INT = struct.Struct("i")


def unread_bytes(sock: socket.socket) -> int:
    """The bytes ``sock``'s receive queue holds (``FIONREAD``); never blocks. OSError where it cannot say."""
    return int(_FIONREAD_INT.unpack(fcntl.ioctl(sock.fileno(), termios.FIONREAD, _FIONREAD_INT.pack(0)))[0])


def receive_room(sock: socket.socket) -> int:
    """The data ``sock``'s receive buffer holds at most as the kernel sizes it now: half of ``SO_RCVBUF``,
    which Linux reports doubled for its own bookkeeping (it grows as reads keep up, to
    ``net.ipv4.tcp_rmem``'s maximum). OSError where it cannot say."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the parts joined by ``|`` (every part but the label has a fixed length)."""
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ConnectionError if the peer closes first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ConnectionError("the connection was closed")
        got += n


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf))
    return bytes(buf)


def bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous 1-D CPU tensor, writable, without a copy."""
    array = t.detach().view(torch.uint8).numpy()
    return memoryview(array).cast("B")  # type: ignore[arg-type]


def _ranks(dialer: int, listener: int) -> bytes:
    return struct.pack("!II", dialer, listener)


def dial(sock: socket.socket, key: bytes, rank: int, peer: int, where: str) -> None:
    """The dialer's side: prove ``key`` as ``rank`` and check that ``peer`` holds it too.

    Raises RuntimeCommError naming ``where`` when the handshake does not complete
    (the peer closes, greets wrongly or fails its proof).
    """
    try:
        hello = recv_exact(sock, len(HELLO) + NONCE_BYTES)
        if not hello.startswith(HELLO):
            raise RuntimeCommError(f"{where}: not a commsched link (greeting {hello[:16]!r})")
        theirs, mine = hello[len(HELLO) :], secrets.token_bytes(NONCE_BYTES)
        ranks = _ranks(rank, peer)
        sock.sendall(DIAL.pack(mine, rank, mac(key, b"dial", theirs, mine, ranks)))
        proof = recv_exact(sock, 32)
    except OSError as exc:
        raise RuntimeCommError(
            f"{where}: authentication failed: {exc} (the peer refused the key, or stopped)"
        ) from None
    if not hmac.compare_digest(proof, mac(key, b"listen", mine, theirs, ranks)):
        raise RuntimeCommError(f"{where}: authentication failed: rank {peer} did not prove the key")


def accept(sock: socket.socket, key: bytes, rank: int, world: int) -> int | None:
    """The listener's side: the rank the dialer proved the key as, or None (a failed proof, a bad rank)."""
    mine = secrets.token_bytes(NONCE_BYTES)
    try:
        sock.sendall(HELLO + mine)
        theirs, peer, proof = DIAL.unpack(recv_exact(sock, DIAL.size))
        ranks = _ranks(peer, rank)
        if hmac.compare_digest(proof, mac(key, b"dial", mine, theirs, ranks)) and 0 <= peer < world and peer != rank:
            sock.sendall(mac(key, b"listen", theirs, mine, ranks))
            return int(peer)
    except (OSError, struct.error):
        pass
    return None
