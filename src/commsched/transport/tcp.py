"""``TcpLink``: the :class:`~commsched.transport.links.Link` protocol over a mesh of authenticated TCP connections.

Opening and authentication (:mod:`commsched.transport.tcp_mesh`)
    Opening is collective over the group (every rank, same order): each rank
    listens, the addresses and key are shared over the group, each rank dials
    every other rank once and sends on that connection, and reads what arrives
    on the connections the others opened to it. Every connection is
    authenticated both ways under the key; one that fails is closed and
    counted (:attr:`TcpLink.rejected`). :class:`~commsched.transport.ps.PsTransport`
    (the ``"ps"`` transport) runs the parameter server over the link.

Frames
    A header (magic, payload bytes, ``TransferKey``, dtype code, numel) and the
    payload, read straight into the posted ``out`` tensor (``recv_into`` a view
    of its bytes). A frame is dropped and counted in :attr:`TcpLink.dropped`
    (by reason) when its dtype is unknown, its length does not match its dtype
    and numel, its key is malformed, its step is not newer than the last one
    taken from that peer for that task and phase (stale or duplicate), or its
    dtype or numel differ from the posted receive; a bad magic or a payload
    above ``max_frame_bytes`` closes the connection. Nothing is ever written
    outside ``out``. A frame for a key nobody has posted yet lands where the
    link's user says it will post the receive (:attr:`TcpLink.landing`: the
    parameter server's inboxes and pull slices), else it is buffered, up
    to ``unposted_cap_bytes`` in all; a frame that does not fit waits, and the
    connection is not read, until its receive is posted or buffers are taken
    (TCP pushes back on the sender). A receive posted for a frame that landed
    where it points finds it there; one buffered is copied. Sends to a peer go out in the order they were made
    (:class:`~commsched.transport.tcp_sender.PeerSender`: written by the
    caller where the socket takes them at once, else by one sender thread
    per peer): together with every rank posting in start order, this is
    what keeps that back-pressure from deadlocking.

Garbage collection
    Opening runs one full pass of the garbage collector and keeps what is
    alive then out of later passes until the link closes
    (``TransportOptions.freeze_gc``, :mod:`commsched._gc`): a full pass
    stops every Python thread, the receiving threads too.

Failures
    A peer whose connection closes or breaks fails every transfer with it at
    once; a hung peer ends waits after the timeout. Both raise
    RuntimeCommError naming the peer and the key. ``close()`` sends what is
    queued, then closes every socket; it is bounded by ``timeout_s``.
    ``priority`` is accepted and not used: the scheduler orders the starts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist

from commsched._gc import hold, nothing_held
from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.transport.base import TransportOptions
from commsched.transport.links import TransferKey
from commsched.transport.tcp_mesh import POLL_S, authenticate, connect, listen, share_addresses
from commsched.transport.tcp_sender import CHUNK_BYTES, PeerSender
from commsched.transport.tcp_transfer import TcpTransfer
from commsched.transport.wire import CODES, DTYPES, HEADER, MAGIC, bytes_of, default_bind_address, recv_exact, recv_into


class TcpLink:
    """Keyed point-to-point transfers among the ranks of ``group`` over TCP (module docstring).

    Its transfers call back (:meth:`TcpTransfer.then`) in the thread that ends them: the receiving thread of the
    peer's connection, or the thread that wrote the frame's last byte.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        timeout_s: float,
        options: TransportOptions | None = None,
        *,
        max_frame_bytes: int = 1 << 32,
        unposted_cap_bytes: int = 256 << 20,
        star: bool = False,
    ) -> None:
        options = options or TransportOptions()
        self._release_gc = nothing_held
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        #: the ranks this one is connected with: every other, or with ``star`` rank 0 and each other rank only
        #: (a leader's channel: ``world - 1`` connections each way instead of ``world * (world - 1)``)
        self.peers = frozenset(
            range(1, self.world) if star and self.rank == 0 else {0} if star else set(range(self.world)) - {self.rank}
        )
        self.timeout_s = timeout_s
        self.max_frame_bytes, self.unposted_cap_bytes = max_frame_bytes, unposted_cap_bytes
        #: frames dropped, by reason; connections that failed authentication
        self.dropped: Counter[str] = Counter()
        #: frames that arrived before their receive was posted: ``"landed"`` where :attr:`landing` said,
        #: ``"buffered"`` in a buffer of the link's own
        self.early_frames: Counter[str] = Counter()
        self.rejected = 0
        self._cond = threading.Condition()
        self._closed = False
        self._dead: dict[int, str] = {}  # peer -> why its connection failed
        self._posted: dict[tuple[int, TransferKey], tuple[torch.Tensor, TcpTransfer]] = {}
        self._early: dict[tuple[int, TransferKey], torch.Tensor] = {}
        self._early_bytes = 0  # what the buffered frames take (not those that landed where ``landing`` said)
        self._landed: set[tuple[int, TransferKey]] = set()  # early frames that landed where ``landing`` said
        #: where a frame for a receive not posted yet lands: ``landing(peer, key, dtype, numel)`` gives the tensor
        #: the receive will be posted with (its dtype and numel, contiguous, not read or written by anyone until
        #: that receive ends), or None for a buffer of the link's own (the default). Called under the link's
        #: lock, by the thread that reads ``peer``'s connection: it must not block or call the link.
        self.landing: Callable[[int, TransferKey, torch.dtype, int], torch.Tensor | None] | None = None
        self._last_step: dict[tuple[int, int, int], int] = {}  # (peer, task, phase) -> newest step taken
        self._incoming: dict[int, socket.socket] = {}  # the first authenticated connection from each peer
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._senders: dict[int, PeerSender] = {}

        host = options.bind or default_bind_address()
        self._listener = listen(host, self.world)
        sockname = self._listener.getsockname()
        #: where this rank listens (host, port)
        self.address = (str(sockname[0]), int(sockname[1]))
        # its receiving threads are Python: a full pass of the collector over the process would stall them
        self._release_gc = hold() if options.freeze_gc else nothing_held
        try:
            self._key, infos = share_addresses(group, self.rank, self.world, host, self.address, options.key)
            self._thread(self._accept_loop, "accept")
            for peer in sorted(self.peers):
                if peer != self.rank:
                    info = infos[peer]
                    assert info is not None
                    self._dial(peer, info[0], info[1])
            self._await_incoming(time.monotonic() + timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- the Link protocol ----

    def send(
        self, peer: int, key: TransferKey, data: torch.Tensor, *, priority: int = 0, loss_bound: float | None = None
    ) -> TcpTransfer:
        """Queue ``data`` for ``peer``; the transfer completes once its bytes are handed to the socket (every
        byte arrives: ``loss_bound`` changes nothing)."""
        t = TcpTransfer(f"rank {self.rank}: send of {key} to rank {peer}", self.timeout_s)
        self._check(peer, data, t.describe)
        header = HEADER.pack(MAGIC, data.numel() * data.element_size(), *key, CODES[data.dtype], data.numel())
        with self._cond:
            if self._closed or peer in self._dead:
                t.finish(RuntimeCommError(f"{t.describe}: {self._dead.get(peer, 'the link is closed')}"))
                return t
        self._senders[peer].send(header, bytes_of(data.view(-1)), t)
        return t

    def recv(self, peer: int, key: TransferKey, out: torch.Tensor, *, loss_bound: float = 0.0) -> TcpTransfer:
        """Receive ``peer``'s ``key`` into ``out`` (every element: TCP loses nothing)."""
        t = TcpTransfer(f"rank {self.rank}: receive of {key} from rank {peer}", self.timeout_s)
        self._check(peer, out, t.describe)
        out = out.view(-1)
        with self._cond:
            where = (peer, key)
            if where in self._posted:
                raise ValueError(f"{t.describe}: already posted")
            # A frame that arrived before its receive was posted is taken even when the peer has closed since
            # (it sent the frame, then closed: a leader's last order, read before the follower asked for it).
            early = self._early.pop(where, None)
            if early is not None:
                if where in self._landed:
                    self._landed.discard(where)
                else:
                    self._early_bytes -= early.numel() * early.element_size()
                    self._cond.notify_all()
                if early.dtype == out.dtype and early.numel() == out.numel():
                    if early.data_ptr() != out.data_ptr():
                        out.copy_(early)
                    t.finish()
                    return t
                self.dropped["size mismatch"] += 1
            if self._closed or peer in self._dead:
                t.finish(RuntimeCommError(f"{t.describe}: {self._dead.get(peer, 'the link is closed')}"))
                return t
            self._posted[where] = (out, t)
        return t

    def close(self, bound_s: float | None = None) -> None:
        """Send what is queued, then close every socket and fail what is pending (bounded by ``bound_s``,
        default ``timeout_s``)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + (self.timeout_s if bound_s is None else bound_s)
        for sender in self._senders.values():
            sender.stop()
        for thread in self._threads:
            if thread.name.startswith("commsched-tcp-send"):
                thread.join(max(0.0, deadline - time.monotonic()))
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, min(1.0, deadline - time.monotonic())))
        with self._cond:
            pending, self._posted = self._posted, {}
        for _, t in pending.values():
            t.finish(RuntimeCommError(f"{t.describe}: the link was closed"))
        self._release_gc()

    def _check(self, peer: int, t: torch.Tensor, describe: str) -> None:
        if peer not in self.peers:
            raise ValueError(f"{describe}: no such peer (world {self.world}, connected to {sorted(self.peers)})")
        if t.device.type != "cpu" or not t.is_contiguous() or t.dtype not in CODES:
            raise ValueError(f"{describe}: needs a contiguous CPU tensor of {', '.join(map(str, CODES))}")

    # ---- connections ----

    def _thread(self, target: Callable[..., None], name: str, *args: object) -> None:
        t = daemon_thread(target, f"commsched-tcp-{name}-r{self.rank}", *args)
        self._threads.append(t)
        t.start()

    def _dial(self, peer: int, host: str, port: int) -> None:
        """Connect to ``peer`` and authenticate both ways; then start the sender thread."""
        sock = connect(host, port, self._key, self.rank, peer, self.timeout_s, self._sockets)
        self._senders[peer] = PeerSender(peer, sock, lambda why: self._fail_peer(peer, why))
        self._thread(self._senders[peer].run, f"send{peer}")

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._sockets.append(sock)
            self._thread(self._serve, "recv", sock)

    def _handshake(self, sock: socket.socket) -> int | None:
        """The listener's side: the authenticated peer's rank, or None (closed and counted)."""
        peer = authenticate(sock, self._key, self.rank, self.world, self.timeout_s)
        if peer is not None:
            return peer
        with self._cond:
            self.rejected += 1
        sock.close()
        return None

    def _await_incoming(self, deadline: float) -> None:
        with self._cond:
            while not self.peers <= self._incoming.keys():
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    missing = sorted(self.peers - self._incoming.keys())
                    raise RuntimeCommError(
                        f"rank {self.rank}: ranks {missing} did not connect and authenticate within "
                        f"{self.timeout_s:g} s ({self.rejected} connection(s) rejected)"
                    )
                self._cond.wait(min(left, POLL_S))

    def _fail_peer(self, peer: int, why: str) -> None:
        with self._cond:
            self._dead.setdefault(peer, why)
            failed = [(k, v) for k, v in self._posted.items() if k[0] == peer]
            for k, _ in failed:
                del self._posted[k]
            self._cond.notify_all()
        for _, (_, t) in failed:
            t.finish(RuntimeCommError(f"{t.describe}: {why}"))

    # ---- receiving ----

    def _serve(self, sock: socket.socket) -> None:
        peer = self._handshake(sock)
        if peer is None:
            return
        with self._cond:
            primary = peer not in self._incoming
            if primary:
                self._incoming[peer] = sock
            self._cond.notify_all()
        try:
            while self._read_frame(peer, sock):
                pass
            why = f"rank {peer} sent a malformed frame; its connection was closed"
        except (OSError, ConnectionError) as exc:
            why = f"the connection from rank {peer} was lost ({exc})"
        sock.close()
        if primary:
            self._fail_peer(peer, why)

    def _read_frame(self, peer: int, sock: socket.socket) -> bool:
        """Read one frame and deliver, buffer or drop it; False when the connection must be closed."""
        magic, nbytes, step, task, phase, code, numel = HEADER.unpack(recv_exact(sock, HEADER.size))
        if magic != MAGIC or nbytes > self.max_frame_bytes:
            with self._cond:
                self.dropped["bad magic" if magic != MAGIC else "oversize"] += 1
            return False
        dtype = DTYPES.get(code)
        reason = None
        if dtype is None:
            reason = "unknown dtype"
        elif numel * dtype.itemsize != nbytes:
            reason = "bad length"
        elif step < 0 or task < 0 or phase not in (0, 1):
            reason = "bad key"
        if reason is not None or dtype is None:
            return self._skip(sock, nbytes, reason or "unknown dtype")
        key = TransferKey(step, task, phase)
        where, stream = (peer, key), (peer, task, phase)
        with self._cond:
            reason = "stale or duplicate" if step <= self._last_step.get(stream, -1) else None
            landed = None if reason is not None or where in self._posted else self._landing(peer, key, dtype, numel)
            full = landed is None and self._early_bytes + nbytes > self.unposted_cap_bytes
            while reason is None and where not in self._posted and full:
                if self._closed:
                    return False
                self._cond.wait(POLL_S)  # back-pressure: wait for a receive to be posted or a buffer taken
                full = self._early_bytes + nbytes > self.unposted_cap_bytes
            posted = self._posted.get(where) if reason is None else None
            if posted is not None and (posted[0].dtype != dtype or posted[0].numel() != numel):
                reason, posted = "size mismatch", None
            if reason is None:
                self._last_step[stream] = step
                if posted is not None:
                    del self._posted[where]
                else:
                    self.early_frames["buffered" if landed is None else "landed"] += 1
                    if landed is None:
                        self._early_bytes += nbytes
        if reason is not None:
            return self._skip(sock, nbytes, reason)
        out = posted[0] if posted is not None else landed if landed is not None else torch.empty(numel, dtype=dtype)
        try:
            recv_into(sock, bytes_of(out))
        except BaseException as exc:
            if posted is not None:
                posted[1].finish(RuntimeCommError(f"{posted[1].describe}: the connection broke mid-frame ({exc})"))
            elif landed is None:
                with self._cond:
                    self._early_bytes -= nbytes
                    self._cond.notify_all()
            raise
        if posted is not None:
            posted[1].finish()
            return True
        with self._cond:
            late = self._posted.pop(where, None)
            if late is None:
                self._early[where] = out
                if landed is not None:
                    self._landed.add(where)
                return True
            if landed is None:
                self._early_bytes -= nbytes
                self._cond.notify_all()
        if late[0].dtype == dtype and late[0].numel() == numel:
            if late[0].data_ptr() != out.data_ptr():
                late[0].copy_(out)
            late[1].finish()
        else:
            with self._cond:
                self.dropped["size mismatch"] += 1
                self._posted[where] = late
        return True

    def _landing(self, peer: int, key: TransferKey, dtype: torch.dtype, numel: int) -> torch.Tensor | None:
        """Where ``landing`` says the frame goes, if it gives a contiguous CPU tensor of its dtype and numel."""
        if self.landing is None:
            return None
        out = self.landing(peer, key, dtype, numel)
        if out is None or out.device.type != "cpu" or out.dtype != dtype or out.numel() != numel:
            return None
        return out.view(-1) if out.is_contiguous() else None

    def _skip(self, sock: socket.socket, nbytes: int, reason: str) -> bool:
        with self._cond:
            self.dropped[reason] += 1
        left = nbytes
        scratch = memoryview(bytearray(min(nbytes, CHUNK_BYTES) or 1))
        while left > 0:
            n = min(left, len(scratch))
            recv_into(sock, scratch[:n])
            left -= n
        return True
