"""The I/O thread of a DLCP link: sockets in, state machines driven, datagrams and control out.

One thread per link owns every socket. Each turn of its loop it waits on the
sockets (at most until the pacer or a timer is due), then, holding the
link's lock: reads datagrams (at most 256 per socket and turn) and control
frames, runs the timers (every millisecond: deadlines, probes, feedback),
and sends what the rate allows (at most 64 datagrams a turn, so receiving
keeps up). The training thread only posts transfers and cancels them, under
the same lock; so a receive's buffer is written only while its slot is
posted, and never after it finished or was cancelled.

A PROBE is answered only once the data sockets were read dry and the
datagrams its sender had sent before it arrived (a PROBE carries the
sender's next data sequence number toward this rank): a receive that may end
at its bound on a probe must not give up datagrams still on their way (on a
busy host, loopback can deliver the TCP probe before UDP datagrams sent
earlier). A datagram the network lost never arrives, so the wait is bounded
by :data:`PROBE_HOLD_S`.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from commsched.errors import WireError
from commsched.transport.dlcp.control import Control
from commsched.transport.dlcp.protocol import (
    Accept,
    Ack,
    Action,
    Bitmap,
    Data,
    PeerFeedback,
    Probe,
    ReceiverState,
    Stop,
    tos_byte,
)
from commsched.transport.dlcp.rate import RateControl, RateParams
from commsched.transport.dlcp.slots import LinkStats, RecvSlot, SendSlot, TransferRecord
from commsched.transport.dlcp.sockets import Endpoints, LinkSockets, recv_tos, send_tos
from commsched.transport.dlcp.wire import ACK, U32, Codec, Datagram, Kind, check_holes, decode_ack, encode_holes
from commsched.transport.links import Received, TransferKey

if TYPE_CHECKING:
    from commsched.transport.dlcp.link import DlcpTransfer

log = logging.getLogger("commsched")

TICK_S = 0.001
READS_PER_TURN = 256
SENDS_PER_TURN = 64
MAX_ENDED = 1 << 16
PROBE_HOLD_S = 0.01  # the longest a probe waits for the datagrams sent before it
Slot = tuple[int, TransferKey]


class Engine:
    """The sockets, the per-key state machines, and the thread that drives them (see the module docstring)."""

    def __init__(
        self, rank: int, world: int, sockets: LinkSockets, peers: Sequence[Endpoints], key: bytes,
        stats: LinkStats, *, timeout_s: float, rate: RateParams, ack_every: int, early_limit_bytes: int,
        stale_steps: int, drop: Callable[[int, int], bool] | None, stop_at_count: bool = False,
    ) -> None:  # fmt: skip
        self.rank, self.world, self.stats, self.timeout_s = rank, world, stats, timeout_s
        self.codec = Codec(key, world)
        self._sockets, self._peers, self._drop = sockets, list(peers), drop
        self._early_limit_bytes, self._stale_steps = early_limit_bytes, stale_steps
        self._stop_at_count = stop_at_count
        self._backlog = False  # a data socket was not read dry this turn
        # probes that wait for the backlog to be read: (probe seq, sender's next data seq, answer by)
        self._held_probes: dict[Slot, tuple[int, int, float]] = {}
        self._lock = threading.Lock()
        self._closing = False
        now = time.monotonic()
        self._rates = [RateControl(rate, now) for _ in range(world)]
        self._feedback = [PeerFeedback(every=ack_every) for _ in range(world)]
        self._sends: dict[Slot, SendSlot] = {}
        self._recvs: dict[Slot, RecvSlot] = {}
        self._early: dict[Slot, list[bytes]] = {}
        self._early_bytes = 0
        self._early_probes: dict[Slot, tuple[int, int]] = {}
        self._ended: dict[Slot, int] = {}  # finished receives -> elements received
        self._newest_step = -1
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
        self._thread = threading.Thread(target=self._run, name=f"dlcp-io-{rank}", daemon=True)
        self._thread.start()

    # ---- the training thread's side ----

    def post(self, slot: SendSlot | RecvSlot, transfer: DlcpTransfer) -> None:
        """Register a transfer (ValueError if its key is already pending); the I/O thread takes it from here."""
        k = (slot.peer, slot.key)
        slot.transfer = transfer
        with self._lock:
            if self._closing:
                transfer.finish(error="the link is closed")
                return
            now = time.monotonic()
            if isinstance(slot, SendSlot):
                if k in self._sends:
                    raise ValueError(f"dlcp: a send to rank {slot.peer} with key {slot.key} is already pending")
                slot.deadline_s = now + self.timeout_s
                self._sends[k] = slot
                if slot.state.done:
                    self._finish_send(slot)
            else:
                if k in self._recvs or k in self._ended:
                    raise ValueError(f"dlcp: a receive from rank {slot.peer} with key {slot.key} was already posted")
                slot.state = ReceiverState(
                    slot.numel, slot.loss_bound, now + self.timeout_s, stop_at_count=self._stop_at_count
                )
                self._recvs[k] = slot
                if slot.key.step > self._newest_step:
                    self._newest_step = slot.key.step
                    self._prune()
                for raw in self._early.pop(k, []):
                    self._early_bytes -= len(raw)
                    self._on_data(self.codec.decode(raw), raw)
                probe = self._early_probes.pop(k, None)
                if probe is not None and k in self._recvs:  # the I/O thread answers it (module docstring)
                    self._held_probes[k] = (*probe, now + PROBE_HOLD_S)
                if slot.state.ended is not None and k in self._recvs:
                    self._finish_recv(slot)
        self._wake()

    def cancel(self, slot: SendSlot | RecvSlot) -> None:
        """End a transfer now (its waiter gave up): a receive sends STOP and writes nothing more."""
        with self._lock:
            k = (slot.peer, slot.key)
            if isinstance(slot, RecvSlot) and self._recvs.get(k) is slot:
                acts: list[Action] = []
                slot.state.cancel(acts)
                self._emit(slot.peer, acts, slot)
                self._finish_recv(slot)
            elif isinstance(slot, SendSlot) and self._sends.get(k) is slot:
                slot.state.on_stop()
                del self._sends[k]
                if slot.transfer is not None:
                    slot.transfer.finish(error="cancelled")

    def close(self, timeout_s: float) -> None:
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        with self._lock:
            self._fail_all("the link was closed")
            self._close_sockets()

    def _fail_all(self, error: str) -> None:
        slots: list[SendSlot | RecvSlot] = [*self._sends.values(), *self._recvs.values()]
        self._sends.clear()
        self._recvs.clear()
        for slot in slots:
            if slot.transfer is not None:
                slot.transfer.finish(error=error)

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
        buf = bytearray(65536)
        next_tick_s = 0.0
        try:
            while not self._closing:
                timeout_s = self._sleep_s(time.monotonic())
                events = self._sel.select(timeout_s)
                with self._lock:
                    if self._closing:
                        break
                    now = time.monotonic()
                    self._backlog = False
                    for key, _mask in sorted(events, key=lambda e: not isinstance(e[0].data, tuple)):  # data first
                        self._on_event(key, buf, now)
                    if self._held_probes and not self._backlog:
                        self._answer_held_probes(now)
                    if now >= next_tick_s:
                        self._tick(now)
                        next_tick_s = now + TICK_S
                    self._send_data(now)
        except Exception as exc:  # a bug must not leave waiters hanging until their timeouts
            log.exception("dlcp: the I/O thread of rank %d failed", self.rank)
            with self._lock:
                self._fail_all(f"the link's I/O thread failed: {exc!r}")

    def _sleep_s(self, now: float) -> float:
        with self._lock:
            delays = [self._rates[s.peer].delay_s(now) for s in self._sends.values() if s.state.pending]
        return min([TICK_S, *delays]) if self._sends or self._recvs else 0.005

    def _on_event(self, key: selectors.SelectorKey, buf: bytearray, now: float) -> None:
        what: Any = key.data
        if isinstance(what, tuple):
            self._read_data(what[1], buf, now)
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

    # ---- data in ----

    def _read_data(self, path: int, buf: bytearray, now: float) -> None:
        sock = self._sockets.data[path]
        view = memoryview(buf)
        for _ in range(READS_PER_TURN):
            try:
                n, tos = recv_tos(sock, buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            self.stats.received += 1
            self.stats.received_per_path[path] += 1
            try:
                d = self.codec.decode(view[:n])
            except WireError as exc:
                self.stats.reject(exc.reason)
                continue
            if d.kind != Kind.DATA or d.rank == self.rank:
                self.stats.reject("kind" if d.kind != Kind.DATA else "rank")
                continue
            ecn = tos & 3
            if ecn:
                self.stats.ecn_capable += 1
                self.stats.ce_marked += ecn == 3
            acts: list[Action] = []
            self._feedback[d.rank].on_data(d.seq, ecn == 3, now, acts)
            self._emit(d.rank, acts, None)
            self._on_data(d, view[:n])
        self._backlog = True  # more may be queued: read it before answering a probe

    def _on_data(self, d: Datagram, raw: memoryview | bytes) -> None:
        k = (d.rank, TransferKey(d.step, d.task, d.phase))
        slot = self._recvs.get(k)
        if slot is None:
            if k in self._ended:
                self.stats.late += 1
            elif d.step < self._newest_step - self._stale_steps:
                self.stats.stale += 1
            elif self._early_bytes + len(raw) > self._early_limit_bytes:
                self.stats.early_dropped += 1
            else:
                self._early.setdefault(k, []).append(bytes(raw))
                self._early_bytes += len(raw)
                self.stats.early_buffered += 1
            return
        if d.dtype != slot.dtype or d.total != slot.numel:
            self.stats.mismatch += 1
            return
        acts: list[Action] = []
        accepted = slot.state.on_data(d.offset, d.numel, d.stride, acts)
        if accepted is Accept.NEW:
            start = d.offset * slot.itemsize
            slot.view[start : start + len(d.payload)] = d.payload
            self.stats.written += 1
        elif accepted is Accept.DUPLICATE:
            self.stats.duplicate += 1
        elif accepted is Accept.LATE:
            self.stats.late += 1
        else:
            self.stats.mismatch += 1
        self._emit(slot.peer, acts, slot)
        if slot.state.ended is not None:
            self._finish_recv(slot)

    def _finish_recv(self, slot: RecvSlot) -> None:
        k = (slot.peer, slot.key)
        del self._recvs[k]
        state = slot.state
        self._ended[k] = state.received
        if len(self._ended) > MAX_ENDED:
            del self._ended[next(iter(self._ended))]
        ended = state.ended or "cancelled"
        self.stats.records.append(TransferRecord(slot.peer, slot.key, slot.numel, state.lost, ended))
        if slot.transfer is None:
            return
        if ended == "deadline":
            slot.transfer.finish(error=f"deadline ({self.timeout_s} s) with {state.lost} of {slot.numel} elements "
                                 f"missing, more than the bound allows ({state.allowed}); {self.stats.mismatch} "
                                 "datagram(s) on this link so far did not fit their receive (dtype, size)")  # fmt: skip
        elif ended == "cancelled":
            slot.transfer.finish(error="cancelled")
        else:
            slot.transfer.finish(Received(state.missing()))

    # ---- control in ----

    def _on_control(self, d: Datagram, now: float) -> None:
        peer = d.rank
        if peer == self.rank or d.kind == Kind.DATA:
            self.stats.reject("kind")
            return
        if d.kind == Kind.ACK:
            sent, received, ce, echo = decode_ack(d)
            self._rates[peer].on_ack(sent, received, ce, echo, now)
            return
        k = (peer, TransferKey(d.step, d.task, d.phase))
        if d.kind == Kind.PROBE:
            recv = self._recvs.get(k)
            if recv is not None and (recv.numel, recv.dtype) == (d.total, d.dtype):
                self._held_probes[k] = (d.seq, d.numel, now + PROBE_HOLD_S)  # answered: module docstring
            elif k in self._ended:
                self._send_control(peer, Kind.STOP, k[1], offset=self._ended[k], total=d.total, dtype=d.dtype)
            elif recv is None and d.step >= self._newest_step - self._stale_steps and len(self._early_probes) < 65536:
                self._early_probes[k] = (d.seq, d.numel)
            else:
                self.stats.control_unmatched += 1
            return
        send = self._sends.get(k)
        if send is None or (send.numel, send.dtype) != (d.total, d.dtype):
            self.stats.control_unmatched += 1
        elif d.kind == Kind.STOP:
            send.state.on_stop()
            self._finish_send(send)
        elif d.kind == Kind.BITMAP:
            send.state.on_bitmap(d.seq, check_holes(d.payload, d.total))

    def _answer_held_probes(self, now: float) -> None:
        held, self._held_probes = self._held_probes, {}
        for k, (seq, sent_before, answer_by) in held.items():
            recv = self._recvs.get(k)
            if recv is None:
                continue
            arrived = (self._feedback[recv.peer].sent - sent_before) % U32 < 2**31
            if arrived or now >= answer_by:
                self._on_probe(recv, seq)
            else:
                self._held_probes[k] = (seq, sent_before, answer_by)

    def _on_probe(self, slot: RecvSlot, seq: int) -> None:
        acts: list[Action] = []
        slot.state.on_probe(seq, acts)
        self._emit(slot.peer, acts, slot)
        if slot.state.ended is not None and self._recvs.get((slot.peer, slot.key)) is slot:
            self._finish_recv(slot)  # the holes were within the bound: the receive ends on the probe

    def _finish_send(self, slot: SendSlot) -> None:
        del self._sends[(slot.peer, slot.key)]
        if slot.transfer is not None:
            slot.transfer.finish()

    # ---- timers ----

    def _tick(self, now: float) -> None:
        for peer in range(self.world):
            if peer != self.rank:
                acts: list[Action] = []
                self._feedback[peer].on_timer(now, acts)
                self._emit(peer, acts, None)
                self._rates[peer].on_timer(now)
        for recv in list(self._recvs.values()):
            acts = []
            if recv.state.deadline(now, acts):
                self._emit(recv.peer, acts, recv)
                self._finish_recv(recv)
        for send in list(self._sends.values()):
            if now >= send.deadline_s:
                del self._sends[(send.peer, send.key)]
                if send.transfer is not None:
                    send.transfer.finish(error=f"no STOP from the receiver within {self.timeout_s} s")
            elif not send.state.pending and send.state.wake_s <= now:
                acts = []
                send.state.next_packets(now, 0, acts)
                self._emit(send.peer, acts, send)

    def _prune(self) -> None:
        floor = self._newest_step - self._stale_steps
        for k in [k for k in self._early if k[1].step < floor]:
            self._early_bytes -= sum(len(raw) for raw in self._early.pop(k))
        for table in (self._early_probes, self._ended):
            for k in [k for k in table if k[1].step < floor]:
                del table[k]

    # ---- out ----

    def _send_data(self, now: float) -> None:
        pending: dict[int, list[SendSlot]] = {}
        for send in self._sends.values():
            if send.state.pending:
                pending.setdefault(send.peer, []).append(send)
        budget = SENDS_PER_TURN
        while pending and budget > 0:
            for peer in list(pending):
                slots = pending[peer]
                rate = self._rates[peer]
                if rate.delay_s(now) > 0:
                    del pending[peer]
                    continue
                slot = min(slots, key=lambda s: s.prio)  # stable: the first posted of the most urgent class
                acts: list[Action] = []
                slot.state.next_packets(now, 4, acts)
                for act in acts:
                    if isinstance(act, Data):
                        self._send_datagram(slot, act, rate, now)
                        budget -= 1
                    else:
                        self._emit(peer, [act], slot)
                if not slot.state.pending:
                    slots.remove(slot)
                    if not slots:
                        del pending[peer]

    def _send_datagram(self, slot: SendSlot, act: Data, rate: RateControl, now: float) -> None:
        start = act.offset * slot.itemsize
        payload = slot.view[start : start + act.numel * slot.itemsize]
        if self._drop is not None and self._drop(slot.peer, act.offset):
            # emulated loss, before the datagram is numbered: the receiver sees no gap and the rate
            # control no congestion (loss that signals congestion comes from a network that drops)
            self.stats.dropped_by_hook += 1
            self.stats.resent += act.resend
            return
        seq = rate.on_send(len(payload) + 94, now)  # + header, MAC, IP and UDP
        k = slot.key
        wire = self.codec.encode(
            Kind.DATA, k.step, k.task, k.phase, self.rank, prio=slot.prio, importance=act.important,
            dtype=slot.dtype, seq=seq, offset=act.offset, numel=act.numel, total=slot.numel, stride=slot.stride,
            payload=payload,
        )  # fmt: skip
        self.stats.sent += 1
        self.stats.resent += act.resend
        self.stats.sent_bytes += len(wire)
        paths = self._sockets.data
        dests = self._peers[slot.peer].data
        try:
            send_tos(paths[seq % len(paths)], wire, tos_byte(slot.prio, bool(act.important)), dests[seq % len(dests)])
        except BlockingIOError:  # this host's send buffer is full: back-pressure, not loss; it goes again
            self.stats.send_errors += 1
            slot.state.requeue(act.offset)
        except OSError:  # refused by the host (e.g. no route): lost, as on a broken link
            self.stats.send_errors += 1

    def _emit(self, peer: int, acts: list[Action], slot: SendSlot | RecvSlot | None) -> None:
        for act in acts:
            if isinstance(act, Ack):
                payload = ACK.pack(act.sent, act.received, act.ce, act.echo)
                self._send_control(peer, Kind.ACK, TransferKey(0, 0, 0), payload=payload, dtype=0, total=0)
                continue
            assert slot is not None
            if isinstance(act, Stop):
                self._send_control(peer, Kind.STOP, slot.key, offset=act.received, total=slot.numel, dtype=slot.dtype)
            elif isinstance(act, Probe):
                self._send_control(peer, Kind.PROBE, slot.key, seq=act.seq, total=slot.numel, dtype=slot.dtype,
                                   numel=self._rates[peer].seq)  # fmt: skip
            elif isinstance(act, Bitmap):
                self._send_control(peer, Kind.BITMAP, slot.key, seq=act.seq, total=slot.numel, dtype=slot.dtype,
                                   payload=encode_holes(act.holes))  # fmt: skip

    def _send_control(self, peer: int, kind: Kind, key: TransferKey, **fields: Any) -> None:
        self._control.send(peer, self.codec.encode(kind, key.step, key.task, key.phase, self.rank, **fields))
