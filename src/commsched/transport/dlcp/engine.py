"""The I/O thread of a DLCP link: sockets in, state machines driven, datagrams and control out.

One thread per link owns every socket. Each turn of its loop it waits on the
sockets (at most until the pacer or a timer is due), then, holding the
link's lock: reads the data sockets (:class:`~commsched.transport.dlcp.inbound.Inbound`:
at most 256 reads per socket and turn, each one datagram or a GRO batch)
and the control connections, runs the timers (every millisecond: deadlines,
probes, feedback), and sends what the rates allow
(:class:`~commsched.transport.dlcp.outbound.Outbound`: at most 256
datagrams a turn, in GSO batches, so receiving keeps up). The training
thread posts transfers without waiting for that lock: a post is checked
(a key already pending is refused at once), queued, and the I/O thread
registers it at the top of its next turn, so a backward pass that starts a
transfer never waits while the I/O thread works through a turn of system
calls (in training on the testbed the training thread waited there about
4 ms per iteration before). A send posted while the link sends nothing
is the exception: its poster tries the lock and, if it is free, sends the
first datagrams itself (:meth:`Engine.post`). Cancelling takes the lock; a
receive's buffer is written only while its slot is registered, and never
after it finished or was cancelled (a transfer finished while still queued
is never registered).

A PROBE is answered only once the data sockets were read dry and the
datagrams its sender had sent before it arrived (a PROBE carries the
sender's next data sequence number toward this rank): a receive that may end
at its bound on a probe must not give up datagrams still on their way (on a
busy host, loopback can deliver the TCP probe before UDP datagrams sent
earlier). A datagram the network lost never arrives, so the wait is bounded
by :data:`~commsched.transport.dlcp.inbound.PROBE_HOLD_S`.

Control messages do not wait on TCP alone. A lost TCP segment holds every
message behind it on its connection until TCP sends it again, and when
nothing follows it that takes a retransmission timeout (Linux: at least
200 ms, its tail-loss probe included): the very tail DLCP removes from the
data. So each control message also goes as a datagram on the first data
path (with :data:`CONTROL_TOS`: served first, marked rather than dropped).
An ACK goes only so: its counts are cumulative, the next one says what a
lost one said. STOP, PROBE and BITMAP go both ways, the TCP copy being the
reliable one; a second copy changes nothing (a STOP for a send already
finished counts as ``control_duplicate``, a second answer to a probe is
ignored, a repeated ACK is out of date). docs/dlcp.md ("Control
messages") has what this changed on the testbed.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from commsched._threads import daemon_thread
from commsched.transport.dlcp import udp
from commsched.transport.dlcp.control import Control
from commsched.transport.dlcp.inbound import Inbound
from commsched.transport.dlcp.outbound import Outbound
from commsched.transport.dlcp.protocol import REORDER, Ack, Action, Bitmap, Probe, Stop, tos_byte
from commsched.transport.dlcp.rate import RateParams
from commsched.transport.dlcp.slots import LinkStats, RecvSlot, SendSlot
from commsched.transport.dlcp.sockets import Endpoints, LinkSockets
from commsched.transport.dlcp.udp import DatagramReader
from commsched.transport.dlcp.wire import ACK, Codec, Datagram, Kind, check_holes, decode_ack, encode_holes
from commsched.transport.links import TransferKey

if TYPE_CHECKING:
    from commsched.transport.dlcp.link import DlcpTransfer

log = logging.getLogger("commsched")

TICK_S = 0.001
#: the resolution of the selector's timeout (epoll's: a millisecond)
EPOLL_RESOLUTION_S = 0.001
_NO_KEY = TransferKey(0, 0, 0)
#: control datagrams go as the front layers' important data: first served, marked rather than dropped
CONTROL_TOS = tos_byte(0, True)


class Engine:
    """The sockets, the two halves of the link, and the thread that drives them (see the module docstring)."""

    def __init__(
        self, rank: int, world: int, sockets: LinkSockets, peers: Sequence[Endpoints], key: bytes,
        stats: LinkStats, *, timeout_s: float, rate: RateParams, ack_every: int, early_limit_bytes: int,
        stale_steps: int, drop: Callable[[int, int], bool] | None, stop_at_count: bool = False,
    ) -> None:  # fmt: skip
        self.rank, self.world, self.stats, self.timeout_s = rank, world, stats, timeout_s
        self.codec = Codec(key, world)
        self._sockets, self._peers = sockets, list(peers)
        self._lock = threading.Lock()  # held by the I/O thread for each turn: a transfer it ends calls back holding it
        self._closing = False
        self._posted: deque[SendSlot | RecvSlot] = deque()  # posts the I/O thread has not registered yet
        # (is a receive, peer, key) of every transfer posted and not finished: a second post of one is refused
        self._claimed: set[tuple[bool, int, TransferKey]] = set()
        self._claims_lock = threading.Lock()
        self.inbound = Inbound(rank, world, self.codec, stats, self, timeout_s=timeout_s, ack_every=ack_every,
                               early_limit_bytes=early_limit_bytes, stale_steps=stale_steps,
                               stop_at_count=stop_at_count, on_control=self._on_control,
                               reorder=REORDER * len(sockets.data))  # fmt: skip
        self.outbound = Outbound(rank, world, self.codec, stats, self, sockets, peers, timeout_s=timeout_s,
                                 rate=rate, drop=drop, now=time.monotonic())  # fmt: skip
        self._readers = [DatagramReader(sock) for sock in sockets.data]
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        stats.received_per_path = [0] * len(sockets.data)
        for path, sock in enumerate(sockets.data):
            self._sel.register(sock, selectors.EVENT_READ, ("data", path))
        try:
            self._control = Control(rank, world, sockets.control, [p.control for p in peers], self._sel, self.codec,
                                    stats, timeout_s)  # fmt: skip
        except ConnectionError:
            self._close_sockets()
            raise
        # not ``_thread``: compiled by mypyc, the field would be named ``__thread``, a keyword of C compilers
        self._io_thread = daemon_thread(self._run, f"dlcp-io-{rank}")
        self._io_thread.start()

    # ---- the training thread's side ----

    def post(self, slot: SendSlot | RecvSlot, transfer: DlcpTransfer) -> None:
        """Queue a transfer for the I/O thread (ValueError if its key is pending, or a receive's already ended)."""
        slot.transfer = transfer
        receive = isinstance(slot, RecvSlot)
        with self._claims_lock:
            claim = (receive, slot.peer, slot.key)
            if claim in self._claimed or (receive and (slot.peer, slot.key) in self.inbound.ended):
                what = "a receive from" if receive else "a send to"
                raise ValueError(f"dlcp: {what} rank {slot.peer} with key {slot.key} was already posted")
            self._claimed.add(claim)
        self._posted.append(slot)
        if self._closing:  # close() may have failed what was queued before this post: fail it here
            with self._lock:
                self._fail_posted("the link is closed")
            return
        if isinstance(slot, SendSlot) and slot.numel and not slot.unclassified and self._idle_for_caller():
            self._send_first(slot)
        self._wake()

    def _idle_for_caller(self) -> bool:
        """The link sends nothing yet and the caller is not its I/O thread (tested after the cheaper checks of
        :meth:`post`, which every post passes through)."""
        return not self.outbound.sends and not self.on_io_thread()

    def _send_first(self, slot: SendSlot) -> None:
        """The link sends nothing: register ``slot`` and send its first datagrams from the caller's thread, if the
        I/O thread is not in a turn (the lock is free); else it does so in its next turn.

        The I/O thread can send only once the caller lets go of Python's lock, and a caller that posts an
        exchange's tasks in a row holds it: the first datagram of an exchange in the tails harness left 0.8-0.95 ms
        after its post (BENCHMARKS.md, "The first datagram of an exchange from its poster"). A send whose packets
        wait to be classified is not taken here (the caller makes no pass over its data). Nothing ends here:
        a send that fails while this thread sends is finished by the I/O thread (``Outbound.deferring``), whose
        callbacks may take locks this caller holds; and the lock is only tried, never waited for."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._closing or self.outbound.sends or slot.transfer is None or slot.transfer.is_completed():
                return
            try:
                self._posted.remove(slot)
            except ValueError:  # failed or taken off meanwhile
                return
            now = time.monotonic()
            self.outbound.deferring = True
            try:
                self.outbound.post(slot, now)
                self.outbound.send(now)
            finally:
                self.outbound.deferring = False
        finally:
            self._lock.release()

    def on_io_thread(self) -> bool:
        """The caller is the I/O thread."""
        return threading.current_thread() is self._io_thread

    def release(self, slot: SendSlot | RecvSlot) -> None:
        """``slot``'s transfer finished: its key may be posted again."""
        with self._claims_lock:
            self._claimed.discard((isinstance(slot, RecvSlot), slot.peer, slot.key))

    def cancel(self, slot: SendSlot | RecvSlot) -> None:
        """End a transfer now (its waiter gave up): a receive sends STOP and writes nothing more.

        A transfer still queued is registered first, so that it ends as any other: a receive's STOP ends the
        peer's send, and its key counts as used."""
        with self._lock:
            if self._posted and not self._closing:
                self._register_posted(time.monotonic())
            if isinstance(slot, RecvSlot):
                self.inbound.cancel(slot)
            else:
                self.outbound.cancel(slot)
            if slot.transfer is not None:  # closing, or it had already ended: whichever came first counts
                slot.transfer.finish(error="cancelled")

    def close(self, timeout_s: float) -> None:
        with self._lock:
            self._closing = True
        self._wake()
        if self._io_thread is not threading.current_thread():
            self._io_thread.join(timeout_s)
        with self._lock:
            self._fail_all("the link was closed")
            self._close_sockets()

    def _fail_all(self, error: str) -> None:
        self._fail_posted(error)
        self.outbound.fail_all(error)
        self.inbound.fail_all(error)

    def _fail_posted(self, error: str) -> None:
        """Fail what is queued (under the lock, as every caller of ``finish`` but the waiter's own fallback)."""
        while self._posted:
            slot = self._posted.popleft()
            if slot.transfer is not None:
                slot.transfer.finish(error=error)

    def _register_posted(self, now: float, send_first: bool = False) -> None:
        """Register the transfers posted since the last turn (under the lock), but none finished meanwhile.

        ``send_first`` (the I/O thread's turn): the new sends' first datagrams go before the new receives replay
        what arrived for them early (a rank that starts its exchange after its peer's datagrams came had up to 0.7 ms
        of them to replay before its first datagram left, in the tails harness at 1 % loss)."""
        recvs: list[RecvSlot] = []
        while self._posted:
            slot = self._posted.popleft()
            if slot.transfer is None or slot.transfer.is_completed():  # it ended while queued (None: ended)
                continue
            if isinstance(slot, SendSlot):
                self.outbound.post(slot, now)
            else:
                recvs.append(slot)
        if send_first and recvs and self.outbound.sends:
            self.outbound.send(now)
        for slot in recvs:
            self.inbound.post(slot, now)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _close_sockets(self) -> None:
        with contextlib.suppress(Exception):
            self._sel.close()
        if hasattr(self, "_control"):
            self._control.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.close()

    # ---- the I/O thread ----

    def _run(self) -> None:
        next_tick_s = 0.0
        inbound, outbound, stats = self.inbound, self.outbound, self.stats
        try:
            while not self._closing:
                events = self._wait(self._sleep_s(time.monotonic()))
                with self._lock:
                    if self._closing:
                        return  # not break: mypyc cannot compile a break out of a with block
                    now = time.monotonic()
                    stats.turns += 1
                    if not events:
                        stats.idle_turns += 1
                    outbound.finish_deferred()
                    if self._posted:
                        self._register_posted(now, send_first=True)
                    inbound.backlog = False
                    for key, _mask in sorted(events, key=lambda e: not isinstance(e[0].data, tuple)):  # data first
                        self._on_event(key, now)
                    if inbound.held_probes and not inbound.backlog:
                        inbound.answer_held_probes(now)
                    if now >= next_tick_s:
                        inbound.tick(now)
                        outbound.tick(now)
                        next_tick_s = now + TICK_S
                    outbound.send(now)
        except Exception as exc:  # a bug must not leave waiters hanging until their timeouts
            log.exception("dlcp: the I/O thread of rank %d failed", self.rank)
            with self._lock:
                self._fail_all(f"the link's I/O thread failed: {exc!r}")

    def _wait(self, timeout_s: float) -> list[tuple[selectors.SelectorKey, int]]:
        """The sockets ready within ``timeout_s``, waiting no longer than that also below a millisecond.

        epoll counts whole milliseconds and Python rounds a shorter timeout up
        to one, so a pacer that lets the next datagrams go in 40 µs would wait a
        millisecond, and a burst of 4 datagrams of 9000 bytes per millisecond
        is 288 Mbit/s: below a 300 Mbit/s link (BENCHMARKS.md, "DLCP keeps its
        own queue short"). Such a wait polls, sleeps (the
        kernel's timer slack, about 50 µs, is its least), and polls again; what
        arrives meanwhile waits in the socket's buffer for at most that long.
        """
        if 0 < timeout_s < EPOLL_RESOLUTION_S:
            events = self._sel.select(0)
            if events:
                return events
            time.sleep(timeout_s)
            return self._sel.select(0)
        return self._sel.select(timeout_s)

    def _sleep_s(self, now: float) -> float:
        with self._lock:
            if self._posted:
                return 0.0
            if not self.outbound.sends and not self.inbound.recvs:
                return 0.005
            if self.outbound.host_queue_wait_s:
                return self.outbound.host_queue_wait_s
            return min(TICK_S, self.outbound.sleep_s(now))

    def _on_event(self, key: selectors.SelectorKey, now: float) -> None:
        what: Any = key.data
        if isinstance(what, tuple):
            self.inbound.read(what[1], self._readers[what[1]], now)
        elif what == "accept":
            self._control.accept()
        elif what == "wake":
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        elif isinstance(what, int):
            self._control.flush(what)
        else:
            for message in self._control.read(what):
                self._on_control(message, now)

    # ---- control in ----

    def _on_control(self, d: Datagram, now: float) -> None:
        peer = d.rank
        if peer == self.rank or d.kind == Kind.DATA:
            self.stats.reject("kind")
            return
        if d.kind == Kind.ACK:
            sent, received, ce, echo = decode_ack(d)
            self.outbound.rates[peer].on_ack(sent, received, ce, echo, now)
        elif d.kind == Kind.PROBE:
            self.inbound.on_probe(d, now)
        else:
            key = TransferKey(d.step, d.task, d.phase)
            send = self.outbound.find(peer, key, d.total, d.dtype)
            if send is None:
                if self.outbound.recently_finished(peer, key):
                    self.stats.control_duplicate += 1
                else:
                    self.stats.control_unmatched += 1
            elif d.kind == Kind.STOP:
                self.outbound.finish(send)
            elif d.kind == Kind.BITMAP:
                reported = send.state.reported
                send.state.on_bitmap(d.seq, check_holes(d.payload, d.total), d.numel, d.offset)
                self.stats.resent_on_report += send.state.reported - reported

    # ---- control out (the halves' Messages) ----

    def emit(self, peer: int, acts: list[Action], slot: SendSlot | RecvSlot | None) -> None:
        for act in acts:
            if isinstance(act, Ack):
                payload = ACK.pack(act.sent, act.received, act.ce, act.echo)
                self._send_control(peer, Kind.ACK, _NO_KEY, payload=payload, dtype=0, total=0)
                continue
            assert slot is not None
            if isinstance(act, Stop):
                self._send_control(peer, Kind.STOP, slot.key, offset=act.received, total=slot.numel, dtype=slot.dtype)
            elif isinstance(act, Probe):
                self.stats.probes += 1
                self._send_control(peer, Kind.PROBE, slot.key, seq=act.seq, total=slot.numel, dtype=slot.dtype,
                                   numel=self.outbound.rates[peer].seq)  # fmt: skip
            elif isinstance(act, Bitmap):
                self.stats.bitmaps += 1
                self._send_control(peer, Kind.BITMAP, slot.key, seq=act.seq, total=slot.numel, dtype=slot.dtype,
                                   numel=act.below, offset=act.allowed, payload=encode_holes(act.holes))  # fmt: skip

    def stop(self, peer: int, key: TransferKey, received: int, total: int, dtype: int) -> None:
        self._send_control(peer, Kind.STOP, key, offset=received, total=total, dtype=dtype)

    def _send_control(self, peer: int, kind: Kind, key: TransferKey, **fields: Any) -> None:
        """ACK as a datagram only; STOP, PROBE and BITMAP as a datagram and on the TCP connection (module docstring)."""
        message = self.codec.encode(kind, key.step, key.task, key.phase, self.rank, **fields)
        with contextlib.suppress(OSError):  # a full send buffer or a refused send: the TCP copy, or the next ACK
            self._send_control_datagram(peer, message)
            self.stats.control_datagrams_sent += 1
        if kind != Kind.ACK:
            self._control.send(peer, message)

    def _send_control_datagram(self, peer: int, message: bytes) -> None:
        udp.send_batch(self._sockets.data[0], (message,), CONTROL_TOS, 0, self._peers[peer].data[0])
