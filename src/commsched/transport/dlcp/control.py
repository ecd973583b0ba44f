"""The control channel of a DLCP link: one TCP connection per ordered pair of ranks, every message MAC'd.

Each rank connects once to every peer and only writes on that connection
(STOP, PROBE and BITMAP toward the peer; each also goes as a datagram, and
ACKs only as datagrams: the engine's module docstring says why); it only
reads the connections it accepts. A message is a wire datagram behind a 4-byte length
(:func:`~commsched.transport.dlcp.sockets.frame`). A connection whose frame
is malformed or fails its MAC is closed: it is not a peer. At most ``2 ·
world + 8`` accepted connections are kept; when full, the oldest that never
sent a valid frame is evicted for a new one, so idle strangers cannot keep a
peer out. Writes are non-blocking with a backlog per peer, bounded at 16 MiB
(a peer that stops reading is given up on).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
from typing import Protocol

from commsched.errors import WireError
from commsched.transport.dlcp.protocol import Action
from commsched.transport.dlcp.slots import LinkStats, RecvSlot, SendSlot
from commsched.transport.dlcp.sockets import Address, FrameReader, frame
from commsched.transport.dlcp.wire import Codec, Datagram
from commsched.transport.links import TransferKey
from commsched.transport.tcp_options import tune_for_cluster

MAX_BACKLOG_BYTES = 16 << 20


class Messages(Protocol):
    """What the two halves of a link (:mod:`~commsched.transport.dlcp.inbound`,
    :mod:`~commsched.transport.dlcp.outbound`) send over the control channel: the engine MACs and sends them."""

    def emit(self, peer: int, acts: list[Action], slot: SendSlot | RecvSlot | None) -> None:
        """Send the control actions among ``acts`` (STOP, PROBE, BITMAP of ``slot``'s transfer; ACK) to ``peer``."""
        ...

    def stop(self, peer: int, key: TransferKey, received: int, total: int, dtype: int) -> None:
        """STOP a transfer this rank no longer holds a receive for."""
        ...


class _Inbound:
    """An accepted control connection; ``trusted`` once a frame on it passed its MAC."""

    __slots__ = ("reader", "sock", "trusted")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.reader, self.trusted = sock, FrameReader(), False


class Control:
    """The TCP connections of one link, driven by the link's I/O thread (which holds the link's lock)."""

    def __init__(
        self, rank: int, world: int, listener: socket.socket, peers: list[Address], sel: selectors.BaseSelector,
        codec: Codec, stats: LinkStats, timeout_s: float,
    ) -> None:  # fmt: skip
        self.world, self.stats, self._codec, self._sel, self._listener = world, stats, codec, sel, listener
        self._inbound: list[_Inbound] = []
        self._out: list[socket.socket | None] = [None] * world
        self._out_buf = [bytearray() for _ in range(world)]
        self._writing: set[int] = set()  # peers whose connection waits in the selector to be writable
        sel.register(listener, selectors.EVENT_READ, "accept")
        try:
            for peer in range(world):
                if peer != rank:
                    conn = socket.create_connection(peers[peer], timeout=timeout_s)
                    tune_for_cluster(conn)
                    conn.setblocking(False)
                    self._out[peer] = conn
        except OSError as exc:
            self.close()
            raise ConnectionError(f"dlcp: rank {rank} cannot reach rank {peer}'s control address: {exc}") from exc

    @property
    def inbound(self) -> int:
        """Accepted connections held open."""
        return len(self._inbound)

    def accept(self) -> None:
        try:
            conn, _addr = self._listener.accept()
        except OSError:
            return
        if len(self._inbound) >= 2 * self.world + 8:  # full: evict the oldest that never sent a valid frame
            stranger = next((c for c in self._inbound if not c.trusted), None)
            self.stats.connections_refused += 1
            if stranger is None:
                conn.close()
                return
            self._drop_inbound(stranger)
        try:
            tune_for_cluster(conn)  # a stranger's connection may already be reset
        except OSError:
            conn.close()
            return
        conn.setblocking(False)
        inbound = _Inbound(conn)
        self._inbound.append(inbound)
        self._sel.register(conn, selectors.EVENT_READ, inbound)

    def _drop_inbound(self, inbound: _Inbound) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(inbound.sock)
        inbound.sock.close()
        self._inbound.remove(inbound)

    def read(self, inbound: _Inbound) -> list[Datagram]:
        """The verified messages that arrived on ``inbound`` (closed on a bad one)."""
        try:
            chunk = inbound.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            chunk = b""
        try:
            frames = inbound.reader.feed(chunk) if chunk else None
        except ValueError:
            self.stats.reject("frame")
            frames = None
        if frames is None:
            self._drop_inbound(inbound)
            return []
        messages = []
        for raw in frames:
            try:
                messages.append(self._codec.decode(raw))
            except WireError as exc:  # not a peer: stop listening to it
                self.stats.reject(exc.reason)
                self._drop_inbound(inbound)
                break
            inbound.trusted = True
        self.stats.control_received += len(messages)
        return messages

    def send(self, peer: int, message: bytes) -> None:
        """Queue one message to ``peer`` and write what the socket takes now."""
        backlog = self._out_buf[peer]
        if len(backlog) > MAX_BACKLOG_BYTES or self._out[peer] is None:
            return  # the peer does not read its control connection: it is gone
        backlog += frame(message)
        self.stats.control_sent += 1
        self.flush(peer)

    def flush(self, peer: int) -> None:
        """Write ``peer``'s backlog; wait for the socket to be writable while some is left."""
        sock, backlog = self._out[peer], self._out_buf[peer]
        if sock is None:
            return
        try:
            sent = sock.send(backlog) if backlog else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._out[peer] = None
            backlog.clear()
            if peer in self._writing:
                self._writing.discard(peer)
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(sock)
            return
        del backlog[:sent]
        # kept in a set: the selector's own lookup of a socket it does not hold formats the socket into its
        # KeyError, which cost about 2 % of the I/O thread's time on every message (py-spy)
        if backlog and peer not in self._writing:
            self._sel.register(sock, selectors.EVENT_WRITE, peer)
            self._writing.add(peer)
        elif not backlog and peer in self._writing:
            self._sel.unregister(sock)
            self._writing.discard(peer)

    def close(self) -> None:
        for sock in [*(c.sock for c in self._inbound), *self._out]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        self._inbound.clear()
