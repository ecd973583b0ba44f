"""Opening a :class:`~commsched.transport.tcp.TcpLink`: where it listens, the shared addresses and key, authentication.

Opening (collective over the group: every rank, same order)
    Each rank listens on ``options.bind`` (default :func:`default_bind_address`:
    the local address that routes to ``MASTER_ADDR``, never ``0.0.0.0`` unless
    given) on an ephemeral port; the addresses are exchanged with
    ``all_gather_object`` over the group, and so is the key when
    ``options.key`` is ``None`` (rank 0 draws 32 bytes with :mod:`secrets`;
    anyone who can read the group's traffic sees it). Each rank then dials
    every other rank once and sends on that connection; it reads what arrives
    on the connections the others opened to it. Opening returns once every
    peer has connected both ways, or raises RuntimeCommError after ``timeout_s``.

Authentication
    Every connection runs an HMAC-SHA256 challenge-response under the key, in
    both directions (:func:`commsched.transport.wire.dial` and
    :func:`~commsched.transport.wire.accept`): the listener sends a nonce, the
    dialer answers with its own nonce, its rank and a MAC over both nonces and
    ranks, and the listener answers with its MAC. A connection that fails is
    closed and counted (:attr:`TcpLink.rejected`); a dialer whose peer does not
    prove the key raises RuntimeCommError at open. Frames are not authenticated
    one by one and nothing is encrypted: the key keeps strangers out, not eavesdroppers.
"""

from __future__ import annotations

import secrets
import socket
import time

import torch.distributed as dist

from commsched.errors import RuntimeCommError
from commsched.transport import wire
from commsched.transport.tcp_options import tune_for_cluster
from commsched.transport.wire import default_bind_address

#: How often a blocked accept or wait looks again (whether the link was closed, whether time is up).
POLL_S = 0.5

#: What each rank tells the others: the host and port it listens on, and rank 0's key offer (else None).
PeerInfo = tuple[str, int, bytes | None]


def listen(host: str, world: int) -> socket.socket:
    """A socket listening on ``host`` at an ephemeral port, its accepts bounded by :data:`POLL_S`."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind(sockaddr)
    listener.listen(max(8, 2 * world))
    listener.settimeout(POLL_S)
    return listener


def share_addresses(
    group: dist.ProcessGroup | None,
    rank: int,
    world: int,
    host: str,
    address: tuple[str, int],
    key: bytes | None,
) -> tuple[bytes, list[PeerInfo | None]]:
    """The key and every rank's :data:`PeerInfo`, gathered over ``group`` (collective).

    The key is ``key``, else the one rank 0 draws; ``host`` ``0.0.0.0`` or ``::`` is advertised as
    :func:`default_bind_address`.
    """
    advertised = default_bind_address() if host in ("0.0.0.0", "::") else address[0]
    offer = secrets.token_bytes(32) if key is None and rank == 0 else None
    infos: list[PeerInfo | None] = [None] * world
    dist.all_gather_object(infos, (advertised, address[1], offer), group=group)
    shared = key if key is not None else (infos[0][2] if infos[0] else None)
    if not shared:
        raise RuntimeCommError(f"rank {rank}: no key to authenticate the link with")
    return bytes(shared), infos


def connect(
    host: str, port: int, key: bytes, rank: int, peer: int, timeout_s: float, sockets: list[socket.socket]
) -> socket.socket:
    """Dial ``peer`` at ``host:port`` and authenticate both ways (the dialer's side).

    The socket joins ``sockets`` as soon as it is connected, so that closing the link closes it.
    Raises RuntimeCommError when the connection or the handshake fails.
    """
    where = f"rank {rank}: connecting to rank {peer} at {host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)  # also bounds each send
        sockets.append(sock)
        tune_for_cluster(sock)
        wire.dial(sock, key, rank, peer, where)
    except OSError as exc:
        raise RuntimeCommError(f"{where}: {exc}") from exc
    return sock


def authenticate(sock: socket.socket, key: bytes, rank: int, world: int, timeout_s: float) -> int | None:
    """The listener's side of the handshake: the authenticated peer's rank, or None (the caller closes ``sock``)."""
    sock.settimeout(timeout_s)
    tune_for_cluster(sock)
    peer = wire.accept(sock, key, rank, world)
    if peer is not None:
        sock.settimeout(None)  # reads wait for data; a transfer's wait bounds how long anyone waits
    return peer


def open_mesh(
    group: dist.ProcessGroup | None,
    rank: int,
    world: int,
    host: str,
    key: bytes | None,
    timeout_s: float,
    handshake_s: float,
    what: str,
) -> tuple[dict[int, socket.socket], int]:
    """One authenticated connection per pair of ranks (collective over ``group``): this rank listens on
    ``host``, accepts the connections of its ``rank`` lower ranks, then dials every higher rank. Returns the
    connections by peer rank, in rank order, and how many connections failed authentication (each closed; a
    silent one delays the others by ``handshake_s`` at most). ``what`` names the connections in errors."""
    listener = listen(host, world)
    peers: dict[int, socket.socket] = {}
    rejected = 0
    try:
        name = listener.getsockname()
        shared, infos = share_addresses(group, rank, world, host, (str(name[0]), int(name[1])), key)
        deadline = time.monotonic() + timeout_s
        while len(peers) < rank:
            if time.monotonic() >= deadline:
                missing = sorted(set(range(rank)) - set(peers))
                raise RuntimeCommError(
                    f"rank {rank}: rank(s) {missing} did not open their {what} within {timeout_s:g} s "
                    f"({rejected} connection(s) rejected)"
                )
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            peer = authenticate(sock, shared, rank, world, min(timeout_s, handshake_s))
            if peer is None or peer > rank or peer in peers:
                rejected += 1
                sock.close()
                continue
            peers[peer] = sock
        for peer in range(rank + 1, world):
            info = infos[peer]
            assert info is not None
            sockets: list[socket.socket] = []
            try:
                peers[peer] = connect(info[0], info[1], shared, rank, peer, timeout_s, sockets)
            finally:
                if peer not in peers:
                    for s in sockets:
                        s.close()
    except BaseException:
        for sock in peers.values():
            sock.close()
        raise
    finally:
        listener.close()
    return dict(sorted(peers.items())), rejected
