"""The deciding leader's orders to its followers, on a connection of their own from rank 0 to each follower.

A completion-driven scheduler (ByteScheduler's and Prophet's credit, the
parameter server's, DLCP's) decides on rank 0; every other rank starts what
rank 0 decided, in its order, and each collective starts only once its
last rank does: the time an order takes to arrive is paid once per decided
task, on the link's clock. So an order is one frame written straight onto
an authenticated TCP connection by the thread that sends it, and read
straight off it by the follower's thread that acts on it — no thread in
between: its follow thread (:meth:`DecisionChannel.receive`) or, at each of
its events, its training thread (:meth:`DecisionChannel.poll`, which never
blocks), one reader at a time. (One frame through the keyed-transfer :class:`~commsched.transport.tcp.TcpLink`,
a sender thread and a reader thread in between, took 0.30 ms over
loopback, median, and 4.3 ms at the 90th percentile beside a computing
thread, where this channel takes 0.05 and 0.09 ms and a bare socket 0.04
and 0.06: ``benchmarks/decision_latency.py``.)

The connections are opened like a :class:`~commsched.transport.tcp.TcpLink`'s
(:mod:`commsched.transport.tcp_mesh`: the addresses and key shared over the
group, an HMAC challenge-response both ways) and take
:func:`~commsched.transport.tcp_options.tune_for_cluster`'s timers: a lost
segment at the end of a small message otherwise waits out Linux's 200 ms
minimum retransmission timeout, and on a lossy network that stalled the
followers, and with them the leader's next collective, in most iterations
(docs/dlcp.md, "Small messages under loss"). A follower listens only while
the channel opens: it accepts rank 0's connection (others are closed and
counted in :attr:`DecisionChannel.rejected`) and closes its listener.

Rank 0 writes a frame without ever blocking the thread that decided it
(:meth:`DecisionChannel.offer`: one non-blocking write per follower, under
the agent's lock, whichever thread decided); only what a follower's socket
does not take at once is left for the agent's sender thread
(:meth:`DecisionChannel.drain`), and every later frame to that follower
queues behind it, so each follower reads the frames in the order they were
decided. A hand-off to the sender for every frame cost the leader a
wake-up of that thread per decision: 97 per iteration under ByteScheduler
on resnet5m unshaped (``benchmarks/thread_cpu.py`` on
``benchmarks/results/unshaped-every-policy-10``).

A frame is a header (magic, number of values) and the values, signed
64-bit little-endian. A follower that reads a bad magic or more than
:data:`MAX_VALUES` values, or whose connection closes, raises
RuntimeCommError: the orders are a stream, and one that cannot be read
leaves nothing to follow.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from array import array
from collections.abc import Callable

import torch.distributed as dist

from commsched.errors import RuntimeCommError
from commsched.transport import TransportOptions
from commsched.transport.tcp_mesh import POLL_S, authenticate, connect, listen, share_addresses
from commsched.transport.wire import default_bind_address

#: A frame's header: magic, number of values.
FRAME = struct.Struct("<II")
MAGIC = 0x43534431  # "CSD1"
#: The most values one message may hold (8 MiB): a follower never buffers more.
MAX_VALUES = 1 << 20
#: The longest a follower waits for one connection's handshake while the channel opens (a silent stranger
#: delays rank 0's connection this long at most, not the whole timeout).
HANDSHAKE_S = 5.0


class DecisionChannel:
    """Rank 0 sends, every other rank receives (collective to open: every rank of ``group``, same order)."""

    __slots__ = (
        "_buffer",
        "_peers",
        "_rank",
        "_read_lock",
        "_timeout_s",
        "_unsent",
        "_unsent_lock",
        "rejected",
        "sockets",
    )

    def __init__(
        self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None
    ) -> None:
        options = options or TransportOptions()
        self._rank, world = dist.get_rank(group), dist.get_world_size(group)
        self._timeout_s = timeout_s
        self._buffer = bytearray()
        #: a follower: one reader at a time (its follow thread in :meth:`receive`, or :meth:`poll`)
        self._read_lock = threading.Lock()
        #: connections that failed authentication while the channel opened
        self.rejected = 0
        #: rank 0: one connection per follower, in rank order; a follower: its connection from rank 0
        self.sockets: list[socket.socket] = []
        self._peers: list[int] = []
        #: rank 0, per follower (in :attr:`sockets`' order): bytes its socket did not take yet, oldest first,
        #: kept until written (while any are, a later frame may not be written ahead of them)
        self._unsent: list[bytearray] = []
        self._unsent_lock = threading.Lock()
        host = options.bind or default_bind_address()
        listener = listen(host, world) if self._rank else None
        try:
            name = listener.getsockname() if listener is not None else (host, 0)
            address = (str(name[0]), int(name[1]))  # rank 0 listens nowhere: it only dials
            key, infos = share_addresses(group, self._rank, world, host, address, options.key)
            if self._rank == 0:
                for peer in range(1, world):
                    info = infos[peer]
                    assert info is not None
                    connect(info[0], info[1], key, 0, peer, timeout_s, self.sockets)  # joins self.sockets
                    self._peers.append(peer)
                self._unsent = [bytearray() for _ in self._peers]
            else:
                assert listener is not None
                self.sockets.append(self._accept_leader(listener, key, world))
                self.sockets[0].settimeout(POLL_S)  # a read looks at ``stop`` this often
                self._peers.append(0)
        except BaseException:
            self.close()
            raise
        finally:
            if listener is not None:
                listener.close()

    def _accept_leader(self, listener: socket.socket, key: bytes, world: int) -> socket.socket:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            if authenticate(sock, key, self._rank, world, min(self._timeout_s, HANDSHAKE_S)) == 0:
                return sock
            self.rejected += 1
            sock.close()
        raise RuntimeCommError(
            f"rank {self._rank}: rank 0 did not open its decision connection within {self._timeout_s:g} s "
            f"({self.rejected} connection(s) rejected)"
        )

    def send(self, values: list[int]) -> None:
        """Rank 0: ``values`` to every other rank, one frame each; returns once in the kernel's buffers (a
        follower that reads nothing for ``timeout_s`` raises RuntimeCommError, as a broken connection does)."""
        self.offer(values)
        self.drain()

    def offer(self, values: list[int]) -> bool:
        """Rank 0: ``values`` to every other rank, one frame each, written without blocking; what a socket does
        not take at once is kept, behind what was kept before. True where something is kept: :meth:`drain`
        (another thread's) writes it. Calls of ``offer`` must not overlap each other (the frames' order)."""
        if len(values) > MAX_VALUES:
            raise ValueError(f"a decision message holds at most {MAX_VALUES} values, got {len(values)}")
        frame = FRAME.pack(MAGIC, len(values)) + array("q", values).tobytes()
        kept = False
        with self._unsent_lock:
            for i, (peer, sock) in enumerate(zip(self._peers, self.sockets, strict=True)):
                unsent = self._unsent[i]
                written = 0
                if not unsent:
                    try:
                        written = os.write(sock.fileno(), frame)  # the socket has a timeout: its fd never blocks
                    except BlockingIOError:
                        pass
                    except OSError as exc:
                        raise RuntimeCommError(f"rank 0: sending decisions to rank {peer} failed ({exc})") from exc
                if written < len(frame):
                    unsent += frame[written:]
                kept = kept or bool(unsent)
        return kept

    def drain(self) -> None:
        """Rank 0: write what :meth:`offer` kept, blocking (each write bounded by ``timeout_s``: a follower that
        reads nothing that long raises RuntimeCommError, as a broken connection does)."""
        for i, (peer, sock) in enumerate(zip(self._peers, self.sockets, strict=True)):
            while True:
                with self._unsent_lock:
                    chunk = bytes(self._unsent[i])
                if not chunk:
                    break
                try:
                    sock.sendall(chunk)
                except OSError as exc:
                    raise RuntimeCommError(f"rank 0: sending decisions to rank {peer} failed ({exc})") from exc
                with self._unsent_lock:
                    del self._unsent[i][: len(chunk)]

    def receive(self, stop: Callable[[], bool] = lambda: False) -> list[int] | None:
        """A follower: rank 0's next message, however long it takes (a plan whose leader does not decide
        sends none; a hung leader is caught by the training thread's own bounded waits); None once ``stop()``
        (looked at every :data:`~commsched.transport.tcp_mesh.POLL_S` without data). Raises RuntimeCommError
        when the leader's connection closes or breaks, or sends what is not a frame."""
        sock = self.sockets[0]
        with self._read_lock:
            while (values := self._take()) is None:
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    if stop():
                        return None
                    continue
                except OSError as exc:
                    raise self._failed(exc) from exc
                if not chunk:
                    raise self._closed()
                self._buffer += chunk
            return values

    def poll(self) -> list[list[int]]:
        """A follower: every whole message already in the kernel's buffers, oldest first, without blocking;
        none while another thread reads (:meth:`receive`). Raises as :meth:`receive` does, once the messages
        before the fault have been returned."""
        if not self._read_lock.acquire(blocking=False):
            return []
        try:
            fault: RuntimeCommError | None = None
            fd = self.sockets[0].fileno()
            while len(self._buffer) <= FRAME.size + 8 * MAX_VALUES:
                try:
                    chunk = os.read(fd, 1 << 16)  # the socket has a timeout: its fd never blocks
                except BlockingIOError:
                    break
                except OSError as exc:
                    fault = self._failed(exc)
                    break
                if not chunk:
                    fault = self._closed()
                    break
                self._buffer += chunk
            messages = []
            while True:
                try:
                    values = self._take()
                except RuntimeCommError as exc:
                    fault = exc
                    break
                if values is None:
                    break
                messages.append(values)
            if fault is not None and not messages:
                raise fault
            return messages
        finally:
            self._read_lock.release()

    def _closed(self) -> RuntimeCommError:
        return RuntimeCommError(f"rank {self._rank}: rank 0 closed its decision connection")

    def _failed(self, exc: OSError) -> RuntimeCommError:
        return RuntimeCommError(f"rank {self._rank}: rank 0's decision connection failed ({exc})")

    def _take(self) -> list[int] | None:
        """The first message in the buffer, if it has arrived whole."""
        if len(self._buffer) < FRAME.size:
            return None
        magic, count = FRAME.unpack_from(self._buffer)
        if magic != MAGIC or count > MAX_VALUES:
            raise RuntimeCommError(
                f"rank {self._rank}: rank 0's decision connection sent a malformed frame "
                f"(magic {magic:#x}, {count} values; at most {MAX_VALUES})"
            )
        end = FRAME.size + 8 * count
        if len(self._buffer) < end:
            return None
        values = array("q")
        values.frombytes(self._buffer[FRAME.size : end])
        del self._buffer[:end]
        return values.tolist()

    def close(self, bound_s: float | None = None) -> None:
        """Close the connections. What :meth:`send` returned from is in the kernel's buffers and still arrives
        (``bound_s`` is accepted for the other links' signature: nothing here waits)."""
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
