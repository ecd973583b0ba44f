"""The receiving half of a DLCP link: posted receives, and the datagrams read for them.

:class:`Inbound` is driven by the link's I/O thread, under the link's lock
(:mod:`~commsched.transport.dlcp.engine`). Each read of a data socket gives
one datagram or a GRO batch of them (:class:`~commsched.transport.dlcp.udp.DatagramReader`);
every datagram of it is verified on its own (:meth:`Codec.decode
<commsched.transport.dlcp.wire.Codec.decode>`: MAC first, then every field)
before anything is written, then accounted for by its receive's
:class:`~commsched.transport.dlcp.protocol.ReceiverState` and copied into
the receive's buffer at its offset.

A datagram for a receive not posted yet is kept (a copy) up to
``early_limit_bytes`` in all, and replayed when the receive is posted;
datagrams of finished receives are ``late``, of steps more than
``stale_steps`` behind the newest receive ``stale``. A PROBE is answered
only once the data sockets were read dry and the datagrams its sender had
sent before it arrived, or :data:`PROBE_HOLD_S` passed (the engine's
module docstring says why). A gap in a peer's datagram numbers that outlives
``reorder`` more of them is reported at once: each receive from that peer
sends its holes unasked, and the sender re-sends those lost in mid-stream.
"""

from __future__ import annotations

from collections.abc import Callable

from commsched.errors import WireError
from commsched.transport.dlcp.control import Messages
from commsched.transport.dlcp.protocol import REORDER, Accept, Action, PeerFeedback, ReceiverState
from commsched.transport.dlcp.slots import LinkStats, RecvSlot, TransferRecord
from commsched.transport.dlcp.udp import DatagramReader
from commsched.transport.dlcp.wire import U32, Codec, Datagram, Kind
from commsched.transport.links import Received, TransferKey

#: Reads of one data socket per turn of the I/O loop (each one datagram or one GRO batch).
READS_PER_TURN = 256
MAX_ENDED = 1 << 16
PROBE_HOLD_S = 0.01  # the longest a probe waits for the datagrams sent before it
#: What a kept early datagram costs beside its payload, counted against ``early_limit_bytes`` so that tiny
#: datagrams cannot flood memory: the decoded fields, the views, the list entry and, for the first of a key, the
#: dict entry and the key (measured 626-926 bytes for a one-byte payload in CPython 3.11).
EARLY_ENTRY_BYTES = 1024
Slot = tuple[int, TransferKey]
_DATA = int(Kind.DATA)


class Inbound:
    """Posted receives and what arrives for them (module docstring); every method runs under the link's lock."""

    def __init__(
        self, rank: int, world: int, codec: Codec, stats: LinkStats, messages: Messages, *, timeout_s: float,
        ack_every: int, early_limit_bytes: int, stale_steps: int, stop_at_count: bool,
        on_control: Callable[[Datagram, float], None], reorder: int = REORDER,
    ) -> None:  # fmt: skip
        self.rank, self.codec, self.stats, self.timeout_s = rank, codec, stats, timeout_s
        self._on_control = on_control  # a control datagram (STOP, PROBE, BITMAP, ACK) read off a data socket
        self._messages = messages
        self._emit = messages.emit
        self._early_limit_bytes, self._stale_steps, self._stop_at_count = early_limit_bytes, stale_steps, stop_at_count
        self.feedback = [PeerFeedback(every=ack_every, reorder=reorder) for _ in range(world)]
        self.recvs: dict[Slot, RecvSlot] = {}
        self.ended: dict[Slot, int] = {}  # finished receives -> elements received
        self.early: dict[Slot, list[Datagram]] = {}
        self.early_bytes = 0
        self._early_probes: dict[Slot, tuple[int, int]] = {}
        # probes that wait for the backlog to be read: (probe seq, sender's next data seq, answer by)
        self.held_probes: dict[Slot, tuple[int, int, float]] = {}
        self.newest_step = -1
        self.backlog = False  # a data socket was not read dry this turn

    # ---- receives posted and ended ----

    def post(self, slot: RecvSlot, now: float) -> None:
        """Register a receive (ValueError if its key was posted before) and replay what arrived for it early."""
        k = (slot.peer, slot.key)
        if k in self.recvs or k in self.ended:
            raise ValueError(f"dlcp: a receive from rank {slot.peer} with key {slot.key} was already posted")
        slot.state = ReceiverState(slot.numel, slot.loss_bound, now + self.timeout_s, stop_at_count=self._stop_at_count)
        self.recvs[k] = slot
        if slot.key.step > self.newest_step:
            self.newest_step = slot.key.step
            self.prune()
        for d in self.early.pop(k, []):
            self.early_bytes -= len(d.payload) + EARLY_ENTRY_BYTES
            self.on_data(d)
        probe = self._early_probes.pop(k, None)
        if probe is not None and k in self.recvs:  # the I/O thread answers it (module docstring)
            self.held_probes[k] = (*probe, now + PROBE_HOLD_S)
        if slot.state.ended is not None and k in self.recvs:
            self.finish(slot)

    def cancel(self, slot: RecvSlot) -> None:
        """End a receive now (its waiter gave up): STOP the sender, write nothing more."""
        if self.recvs.get((slot.peer, slot.key)) is slot:
            acts: list[Action] = []
            slot.state.cancel(acts)
            self._emit(slot.peer, acts, slot)
            self.finish(slot)

    def finish(self, slot: RecvSlot) -> None:
        k = (slot.peer, slot.key)
        del self.recvs[k]
        state = slot.state
        self.ended[k] = state.received
        if len(self.ended) > MAX_ENDED:
            del self.ended[next(iter(self.ended))]
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

    def fail_all(self, error: str) -> None:
        slots = list(self.recvs.values())
        self.recvs.clear()
        for slot in slots:
            if slot.transfer is not None:
                slot.transfer.finish(error=error)

    # ---- data in ----

    def read(self, path: int, reader: DatagramReader, now: float) -> None:
        """Read data socket ``path`` (at most :data:`READS_PER_TURN` reads) and take every datagram it gives."""
        stats, view, take = self.stats, reader.view, self._take
        for _ in range(READS_PER_TURN):
            try:
                nbytes, segment, tos = reader.read()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            stats.recv_calls += 1
            if segment >= nbytes:  # one datagram (an empty one too: the codec refuses it)
                take(view[:nbytes], tos, path, now)
                continue
            for start in range(0, nbytes, segment):  # a GRO batch: 0 < segment < nbytes
                take(view[start : min(start + segment, nbytes)], tos, path, now)
        self.backlog = True  # more may be queued: read it before answering a probe

    def _take(self, raw: memoryview, tos: int, path: int, now: float) -> None:
        """One datagram off the wire: verify it, feed the sender's rate control, write it."""
        stats = self.stats
        stats.received += 1
        stats.received_per_path[path] += 1
        try:
            d = self.codec.decode(raw)
        except WireError as exc:
            stats.reject(exc.reason)
            return
        if d.rank == self.rank:
            stats.reject("rank")
            return
        if d.kind != _DATA:
            stats.control_received += 1
            self._on_control(d, now)
            return
        ecn = tos & 3
        if ecn:
            stats.ecn_capable += 1
            stats.ce_marked += ecn == 3
        acts: list[Action] = []
        below = self.feedback[d.rank].on_data(d.seq, ecn == 3, now, acts)
        if acts:
            self._emit(d.rank, acts, None)
        self.on_data(d)
        if below is not None:
            self.report(d.rank, below)

    def report(self, peer: int, below: int) -> None:
        """Datagrams from ``peer`` numbered before ``below`` are lost: report the holes of each of its receives
        (:meth:`ReceiverState.report <commsched.transport.dlcp.protocol.ReceiverState.report>`)."""
        for slot in [s for s in self.recvs.values() if s.peer == peer]:
            acts: list[Action] = []
            slot.state.report(below, acts)
            if acts:
                self.stats.reports += 1
                self._emit(peer, acts, slot)

    def on_data(self, d: Datagram) -> None:
        """A verified DATA datagram: write it into its receive, or keep it for one not posted yet, or count it.

        A datagram kept is kept verified, with a copy of its payload (the read buffer is reused), so that
        replaying it when its receive is posted neither copies the header again nor checks the MAC twice.
        """
        k = (d.rank, TransferKey(d.step, d.task, d.phase))
        slot = self.recvs.get(k)
        stats = self.stats
        if slot is None:
            size = len(d.payload) + EARLY_ENTRY_BYTES
            if k in self.ended:
                stats.late += 1
            elif d.step < self.newest_step - self._stale_steps:
                stats.stale += 1
            elif self.early_bytes + size > self._early_limit_bytes:
                stats.early_dropped += 1
            else:
                self.early.setdefault(k, []).append(d._replace(payload=memoryview(bytes(d.payload))))
                self.early_bytes += size
                stats.early_buffered += 1
            return
        if d.dtype != slot.dtype or d.total != slot.numel:
            stats.mismatch += 1
            return
        acts: list[Action] = []
        accepted = slot.state.on_data(d.offset, d.numel, d.stride, acts)
        if accepted is Accept.NEW:
            start = d.offset * slot.itemsize
            slot.view[start : start + len(d.payload)] = d.payload
            stats.written += 1
        elif accepted is Accept.DUPLICATE:
            stats.duplicate += 1
        elif accepted is Accept.LATE:
            stats.late += 1
        else:
            stats.mismatch += 1
        if acts:
            self._emit(slot.peer, acts, slot)
        if slot.state.ended is not None:
            self.finish(slot)

    # ---- probes ----

    def on_probe(self, d: Datagram, now: float) -> None:
        """A PROBE from ``d.rank``: hold it for its receive, answer STOP for one that ended, or keep it early."""
        peer = d.rank
        k = (peer, TransferKey(d.step, d.task, d.phase))
        recv = self.recvs.get(k)
        if recv is not None and (recv.numel, recv.dtype) == (d.total, d.dtype):
            self.held_probes[k] = (d.seq, d.numel, now + PROBE_HOLD_S)  # answered: module docstring
        elif k in self.ended:
            self._messages.stop(peer, k[1], self.ended[k], d.total, d.dtype)
        elif recv is None and d.step >= self.newest_step - self._stale_steps and len(self._early_probes) < 65536:
            self._early_probes[k] = (d.seq, d.numel)
        else:
            self.stats.control_unmatched += 1

    def answer_held_probes(self, now: float) -> None:
        held, self.held_probes = self.held_probes, {}
        for k, (seq, sent_before, answer_by) in held.items():
            recv = self.recvs.get(k)
            if recv is None:
                continue
            arrived = (self.feedback[recv.peer].sent - sent_before) % U32 < 2**31
            if arrived or now >= answer_by:
                if not arrived:
                    self.stats.probes_held_out += 1
                acts: list[Action] = []
                recv.state.on_probe(seq, acts)
                self._emit(recv.peer, acts, recv)
                if recv.state.ended is not None and self.recvs.get(k) is recv:
                    self.finish(recv)  # the holes were within the bound: the receive ends on the probe
            else:
                self.held_probes[k] = (seq, sent_before, answer_by)

    # ---- timers ----

    def tick(self, now: float) -> None:
        """Acknowledge what is unacknowledged for too long; end receives at their deadline."""
        for peer, feedback in enumerate(self.feedback):
            if peer != self.rank:
                acts: list[Action] = []
                feedback.on_timer(now, acts)
                if acts:
                    self._emit(peer, acts, None)
        for recv in list(self.recvs.values()):
            acts = []
            if recv.state.deadline(now, acts):
                self._emit(recv.peer, acts, recv)
                self.finish(recv)

    def prune(self) -> None:
        floor = self.newest_step - self._stale_steps
        for k in [k for k in self.early if k[1].step < floor]:
            self.early_bytes -= sum(len(d.payload) + EARLY_ENTRY_BYTES for d in self.early.pop(k))
        for table in (self._early_probes, self.ended):
            for k in [k for k in table if k[1].step < floor]:
                del table[k]
