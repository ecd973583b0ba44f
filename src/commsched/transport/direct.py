"""Collectives of CPU tensors straight over TCP, with no collective library's threads between.

Why
    On a host whose cores also compute, a message costs the CPU work of
    moving it. A 4 KiB all-reduce of 2 ranks through gloo took 847 µs of
    process CPU (1466 µs wall) where sending the same bytes over one TCP
    connection and adding took 23 µs (52 µs wall); 1 MiB: 1073 against
    322 µs (``python benchmarks/message_cost.py``,
    ``benchmarks/results/message-cost/``). gloo hands every op to a worker
    thread and every transfer to its device thread; here the thread that
    starts the op writes it and the thread that waits for it reads.
    :class:`~commsched.transport.collectives.Collectives` routes an
    all-reduce of CPU tensors here (:meth:`DirectCollectives.takes`): between 2
    ranks at any size, since each rank then sends its buffer once, as gloo's
    ring of 2 does; among more only where each rank sends at most
    :data:`DIRECT_MAX_BYTES` (``(world - 1) ·`` the buffer's bytes, where the
    ring sends ``2 (world - 1) / world`` of it). Reduce-scatters and
    all-gathers of CPU tensors between 2 ranks come here too
    (:meth:`DirectCollectives.takes_shards`): each rank sends its peer half
    the buffer, the ring's one step, but the next op's bytes follow on the
    connection at once, where the ring's thread starts an op only once the
    one before it has completed, and waits for a core to do so (at 300
    Mbit/s the link idled 5 ms after a 4 KiB all-gather while the training
    thread computed: BENCHMARKS.md, "Reduce-scatters and all-gathers over
    the runtime's own connections").

Connections (collective to open: every rank of the group, same order)
    One TCP connection per pair of ranks, carrying frames both ways
    (:func:`commsched.transport.tcp_mesh.open_mesh`: each rank listens where
    ``TransportOptions.bind`` says, each connection is authenticated both ways
    under the job's key, one that fails is closed and counted in
    :attr:`DirectCollectives.rejected`).

An op
    :meth:`DirectCollectives.start` writes the buffer to every peer (a frame:
    magic, sequence number, payload bytes, then the payload as it lies in
    memory; a reduce-scatter writes each peer its chunk, an all-gather the
    shard) without ever blocking the thread that starts it: one
    non-blocking ``writev`` per peer, and what the socket does not take at
    once that peer's sender thread writes from the buffer, in order
    (:class:`~commsched.transport.tcp_sender.PeerSender`, as a
    :class:`~commsched.transport.tcp.TcpLink` sends), while the op
    completes only once it is written (a rank that starts ops may be the one
    whose next message lets its peer start them: the leader of
    ByteScheduler, Prophet and ``ps`` sends its
    decisions after it starts the ops they name). Ops complete in start
    order: a thread that waits for one reads, for every op not yet complete
    up to it, one frame from each peer into scratch memory and sums the
    ranks' buffers (a reduce-scatter: their chunks of this rank) in rank order,
    ``b_0 + b_1 + ... + b_(p-1)`` (the same bits on every rank); an
    all-gather's frames land straight in their chunks of the buffer. Every
    rank starts the same collectives in the same order
    and reads each connection's frames in the order they were written.
    :meth:`DirectHandle.try_complete` does the same without ever blocking,
    where every frame up to the op is already in the kernel's buffers
    (``FIONREAD``), so that the training thread can complete an op at its
    next hook instead of waking a thread to wait for it
    (:mod:`commsched.runtime.agent`).

Failures
    A frame whose magic, sequence number or length is not the op's (the ranks
    no longer agree on the ops), a connection that closes or breaks, and no
    data within the timeout each raise RuntimeCommError naming the peer and
    the op, from that op's ``wait()`` and from every op's after it. A frame
    is read into memory sized by the op waiting for it: nothing a peer sends
    allocates more.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.transport.direct_frames import FRAME, MAGIC, Op, read_into, sum_in_rank_order
from commsched.transport.tcp_mesh import open_mesh
from commsched.transport.tcp_sender import PeerSender
from commsched.transport.wire import bytes_of, default_bind_address, receive_room, unread_bytes

if TYPE_CHECKING:  # base imports the collectives, which import this module
    from commsched.transport.base import TransportOptions

__all__ = ["DIRECT_MAX_BYTES", "DirectCollectives", "DirectHandle"]

#: Among more than 2 ranks, the most bytes one rank sends for an all-reduce that goes over the direct
#: connections (``(world - 1) ·`` the buffer's bytes): 1 MiB, where the exchange of 2 ranks still took 0.30x
#: gloo's CPU (above) and the all-to-all's extra bytes cost little beside the ring's ``2 (world - 1)`` steps.
DIRECT_MAX_BYTES = 1 << 20
#: The most scratch memory kept between ops (beyond one op's own, whatever its size).
SCRATCH_CAP_BYTES = 256 << 20
#: The longest one connection's handshake may take while the mesh opens (a silent stranger delays it this
#: long at most, not the whole timeout).
HANDSHAKE_S = 5.0


class DirectHandle:
    """A collective started on a :class:`DirectCollectives`; ``wait()`` completes it and every op before it."""

    __slots__ = ("_op", "_owner")

    def __init__(self, owner: DirectCollectives, op: Op) -> None:
        self._owner, self._op = owner, op

    def wait(self, timeout_s: float | None = None) -> None:
        self._owner.complete_through(self._op, timeout_s)

    def is_completed(self) -> bool:
        """True once a ``wait()`` or :meth:`try_complete` (of this op or a later one) completed it: the peers'
        frames are read by whoever waits, so an op nobody waits for stays incomplete."""
        return self._op.done.is_set()

    def fits_buffers(self) -> bool:
        """Whether each peer's frame for this op fits half its connection's receive buffer as the kernel
        sizes it now (it grows as reads keep up, to ``net.ipv4.tcp_rmem``'s maximum): then the frame can
        wait there whole, unread, without stopping the peer's sender, until :meth:`try_complete` takes it."""
        return self._owner.fits_buffers(self._op.frame_bytes)

    def try_complete(self) -> bool:
        """Complete this op (and every op before it) if that needs no waiting: each peer's frames are all
        in the kernel's buffers, this rank's are sent, and no other thread is reading; never blocks. True
        once the op is complete (an op that failed raises its error from ``wait()``)."""
        return self._owner.try_complete_through(self._op)


class DirectCollectives:
    """SUM all-reduces, reduce-scatters and all-gathers of CPU tensors over a mesh of TCP connections
    (collective to open)."""

    __slots__ = (
        "_backlog",
        "_error",
        "_next",
        "_pending",
        "_read_lock",
        "_scratch",
        "_send_lock",
        "_senders",
        "_state",
        "_threads",
        "peers",
        "rank",
        "rejected",
        "timeout_s",
        "world",
    )

    def __init__(self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None):
        bind, given_key = (options.bind, options.key) if options is not None else (None, None)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.timeout_s = timeout_s
        #: connections that failed authentication while the mesh opened
        self.rejected = 0
        #: peer rank -> its connection, in rank order
        self.peers: dict[int, socket.socket] = {}
        self._send_lock = threading.Lock()  # every peer's frames in start order
        self._senders: dict[int, PeerSender] = {}
        self._threads: list[threading.Thread] = []
        self._read_lock = threading.Lock()  # one reader at a time: ops complete in start order
        self._state = threading.Lock()  # the queue of ops not yet complete
        self._pending: deque[Op] = deque()
        self._next = 0
        self._error: RuntimeCommError | None = None
        self._scratch: dict[tuple[int, torch.dtype, int], torch.Tensor] = {}
        try:
            self.peers, self.rejected = open_mesh(
                group, self.rank, self.world, bind or default_bind_address(), given_key, timeout_s, HANDSHAKE_S,
                "direct all-reduce connection",
            )  # fmt: skip
            for peer, sock in self.peers.items():
                # bounds the sender thread's writes (a timeout leaves the descriptor non-blocking: the inline
                # writev); reads wait with select, bounded by the wait
                sock.settimeout(timeout_s)
                sender = self._senders[peer] = PeerSender(peer, sock, self._failed_to_send)
                self._threads.append(daemon_thread(sender.run, f"commsched-dsend{peer}-r{self.rank}"))
                self._threads[-1].start()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def takes(flat: torch.Tensor, world: int) -> bool:
        """Whether an all-reduce of ``flat`` among ``world`` ranks goes over the direct connections: a CPU
        tensor, of any size between 2 ranks (each sends its buffer once, as gloo's ring does), else where each
        rank sends at most :data:`DIRECT_MAX_BYTES`."""
        return flat.device.type == "cpu" and (world == 2 or (world - 1) * flat.nbytes <= DIRECT_MAX_BYTES)

    @staticmethod
    def takes_shards(flat: torch.Tensor, world: int) -> bool:
        """Whether a reduce-scatter or all-gather of ``flat`` among ``world`` ranks goes over the direct
        connections: a CPU tensor between 2 ranks, where the exchange is the ring's one step. Among more the
        ring's ``p - 1`` steps keep each rank to one peer at a time, as the simulator prices them."""
        return flat.device.type == "cpu" and world == 2

    def start(self, flat: torch.Tensor, describe: str) -> DirectHandle:
        """Send ``flat`` to every peer and return a handle at once; after its ``wait()``, ``flat`` holds the sum
        (leave it alone until then: what the sockets did not take at once is written from it)."""
        payload = bytes_of(flat.view(-1))
        return self._start(Op(0, flat, describe, flat.nbytes), dict.fromkeys(self._senders, payload))

    def start_reduce_scatter(self, flat: torch.Tensor, shard: torch.Tensor, describe: str) -> DirectHandle:
        """Send each peer its chunk of ``flat`` (``flat.numel() == world · shard.numel()``) and return at once;
        after ``wait()``, ``shard`` holds the rank-order sum of every rank's chunk ``rank`` (``flat`` is read,
        never written: ``shard`` may be this rank's chunk of it)."""
        chunks = flat.view(-1).chunk(self.world)
        payloads = {peer: bytes_of(chunks[peer]) for peer in self._senders}
        return self._start(Op(0, flat, describe, shard.nbytes, shard, "reduce_scatter"), payloads)

    def start_all_gather(self, shard: torch.Tensor, flat: torch.Tensor, describe: str) -> DirectHandle:
        """Send ``shard`` to every peer and return at once; after ``wait()``, chunk ``r`` of ``flat`` holds rank
        ``r``'s shard (each peer's is read straight into its chunk)."""
        payload = bytes_of(shard.view(-1))
        return self._start(
            Op(0, flat, describe, shard.nbytes, shard, "all_gather"), dict.fromkeys(self._senders, payload)
        )

    def _start(self, op: Op, payloads: dict[int, memoryview]) -> DirectHandle:
        with self._send_lock:
            op.seq = self._next
            self._next += 1
            with self._state:
                self._pending.append(op)
            if self._error is None:
                header = FRAME.pack(MAGIC, op.seq, op.frame_bytes)
                op.unsent += len(self._senders)
                for peer, sender in self._senders.items():
                    sender.send(header, payloads[peer], op)
        op.finish()  # start's own part
        return DirectHandle(self, op)

    def complete_through(self, op: Op, timeout_s: float | None = None) -> None:
        """Complete every op up to ``op`` in start order (reading the peers' frames); raise its error."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while not op.done.is_set():
            if not self._read_lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                raise RuntimeCommError(f"{op.describe} did not complete within {limit:g} s")
            try:
                while not op.done.is_set():
                    with self._state:
                        oldest = self._pending[0]
                    self._finish(oldest, deadline, limit)
            finally:
                self._read_lock.release()
        if op.error is not None:
            raise op.error

    def try_complete_through(self, op: Op) -> bool:
        """:meth:`complete_through` where every op up to ``op`` has arrived whole and is sent, else nothing
        (also while another thread reads); never blocks. True once ``op`` is complete."""
        if op.done.is_set():
            return True
        if not self._read_lock.acquire(blocking=False):
            return False
        try:
            while not op.done.is_set():
                with self._state:
                    oldest = self._pending[0]
                if self._error is None and not (oldest.sent.is_set() and self._arrived(oldest)):
                    return False
                self._finish(oldest, time.monotonic() + self.timeout_s, self.timeout_s)
            return True
        finally:
            self._read_lock.release()

    def fits_buffers(self, nbytes: int) -> bool:
        """Whether a frame of ``nbytes`` fits every connection's receive buffer (:func:`wire.receive_room`)."""
        try:
            return all(FRAME.size + nbytes <= receive_room(sock) for sock in self.peers.values())
        except OSError:
            return False

    def _arrived(self, op: Op) -> bool:
        """Whether every peer's frame for ``op`` (the oldest not yet read) is in the kernel's buffers."""
        need = FRAME.size + op.frame_bytes
        for sock in self.peers.values():
            try:
                if unread_bytes(sock) < need:
                    return False
            except OSError:
                return True  # let the read meet the error and report it
        return True

    def _finish(self, op: Op, deadline: float, limit: float) -> None:
        if self._error is None:
            try:
                self._receive(op, deadline, limit)
            except RuntimeCommError as exc:
                self._fail(exc)
        if self._error is not None:
            op.error = self._error if op.error is None else op.error
        with self._state:
            self._pending.popleft()
        op.done.set()

    def _receive(self, op: Op, deadline: float, limit: float) -> None:
        flat = op.flat.view(-1)
        chunks = flat.chunk(self.world) if op.shard is not None else ()
        mine = flat if op.shard is None else op.shard.view(-1)  # what this rank adds: the frames' size
        parts: list[torch.Tensor] = []
        for peer, sock in self.peers.items():
            # an all-gather's frame lands in its chunk; the others' in scratch memory, summed below
            into = chunks[peer] if op.kind == "all_gather" else self._scratch_for(peer, mine)
            where = f"{op.describe}: rank {peer}"
            header = bytearray(FRAME.size)
            read_into(sock, memoryview(header), deadline, where, limit)
            magic, seq, nbytes = FRAME.unpack(header)
            if magic != MAGIC or seq != op.seq or nbytes != op.frame_bytes:
                raise RuntimeCommError(
                    f"{where} sent a frame for another op (magic {bytes(magic)!r}, op {seq}, {nbytes} bytes; "
                    f"expected op {op.seq}, {op.frame_bytes} bytes): the ranks no longer start the same collectives"
                )
            read_into(sock, bytes_of(into), deadline, where, limit)
            parts.append(into)
        while not op.sent.wait(timeout=min(max(deadline - time.monotonic(), 0.0), 0.5)):
            if self._error is not None:
                raise self._error
            if time.monotonic() >= deadline:
                raise RuntimeCommError(f"{op.describe}: its buffer was not sent within {limit:g} s")
        if op.kind == "all_reduce":
            sum_in_rank_order(parts, self.rank, flat, flat)
        elif op.kind == "reduce_scatter":
            sum_in_rank_order(parts, self.rank, chunks[self.rank], mine)
        elif chunks[self.rank].data_ptr() != mine.data_ptr():
            chunks[self.rank].copy_(mine)

    def _scratch_for(self, peer: int, flat: torch.Tensor) -> torch.Tensor:
        """Memory to read ``peer``'s frame into, kept for the next op of that size (a plan repeats its sizes
        every iteration; a fresh large tensor costs its page faults again); at most :data:`SCRATCH_CAP_BYTES`
        kept beside the one in use."""
        key = (peer, flat.dtype, flat.numel())
        scratch = self._scratch.get(key)
        if scratch is None:
            if sum(t.nbytes for t in self._scratch.values()) + flat.nbytes > SCRATCH_CAP_BYTES:
                self._scratch.clear()  # e.g. after a plan switch: the old plan's sizes
            scratch = self._scratch[key] = torch.empty_like(flat)
        return scratch

    def _fail(self, error: RuntimeCommError) -> None:
        if self._error is None:
            self._error = error

    def _failed_to_send(self, why: str) -> None:
        self._fail(RuntimeCommError(f"rank {self.rank}: {why}"))

    def close(self) -> None:
        """Write what the senders still hold (bounded by ``timeout_s``: a peer may still wait for it), then close
        the connections; ops not yet complete fail."""
        deadline = time.monotonic() + self.timeout_s
        for sender in self._senders.values():
            sender.stop()
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        self._fail(RuntimeCommError(f"rank {self.rank}: the direct all-reduce connections were closed"))
        for sock in self.peers.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=1.0)  # a write in progress ended with the shutdown
        for sock in self.peers.values():
            sock.close()
