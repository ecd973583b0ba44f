"""The sending half of a DLCP link: posted sends, paced, batched, sprayed over the paths.

:class:`Outbound` is driven by the link's I/O thread, under the link's lock
(:mod:`~commsched.transport.dlcp.engine`). Each turn, per destination, it
serves the most urgent send (the earliest step, then the earliest phase of
its task, then the lowest layer class; among equals the first posted): it
takes the send's next packets one by one while the destination's
:class:`~commsched.transport.dlcp.rate.RateControl` lets one more go
(:meth:`~commsched.transport.dlcp.rate.RateControl.delay_s` is 0; each
numbered by :meth:`~commsched.transport.dlcp.rate.RateControl.on_send`), so
the pacing is exactly that of one datagram at a time. Datagram ``seq``
leaves by local path ``seq mod paths`` toward the peer's path address ``seq
mod paths`` (per-packet spraying). The datagrams taken are then sent in as
few system calls as the kernel allows: those of one path and one TOS byte
(layer class and importance) go together in one UDP GSO send
(:mod:`~commsched.transport.dlcp.udp`), the one shorter datagram a transfer
may have (its tail) last, each datagram whole, self-describing and MAC'd
(:meth:`~commsched.transport.dlcp.wire.Codec.data_parts`), within the MTU.

**This host's queue.** The rate control never reads the link's rate, and on
a link that neither marks nor drops it allows several times that rate: the
datagrams then wait in this host's own queue (the qdisc of its interface),
where the peer's ACKs, STOPs and BITMAPs wait behind its own datagrams
toward this host, and the round trip the peer's window was sized for (from
the least round trip seen) grows until the window, not the link, sets its
pace. On the testbed one rank in some runs sent 25 % below the link's
rate that way for a whole run (BENCHMARKS.md, "DLCP keeps its own queue
short"). So, as TCP Small Queues does for TCP, a turn sends only while the
datagrams of a path this host still holds
(:func:`~commsched.transport.dlcp.udp.queued_bytes`) are fewer than
:data:`HOST_QUEUE_BURSTS` pacer bursts; the rest wait in the link, where the
send order still applies, and the I/O loop looks again when about half of
them will have left (:data:`HOST_QUEUE_POLL_S`).

A batch the host's send buffer refuses (EAGAIN) is queued again, datagram by
datagram; a route that cannot segment (:data:`~commsched.transport.dlcp.udp.GSO_REFUSED`)
turns GSO off for that socket (once, with a warning) and the batch goes
again one datagram per call; a datagram larger than the route's MTU
(EMSGSIZE: the sockets never fragment) fails its send with an error naming
the sizes.
"""

from __future__ import annotations

import errno
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

from commsched.transport.dlcp import udp
from commsched.transport.dlcp.control import Messages
from commsched.transport.dlcp.protocol import Action, Data, send_order, tos_byte
from commsched.transport.dlcp.rate import RateControl, RateParams
from commsched.transport.dlcp.slots import LinkStats, SendSlot
from commsched.transport.dlcp.sockets import Endpoints, LinkSockets
from commsched.transport.dlcp.wire import HEADER, IPV4_UDP_BYTES, MAC_BYTES, Codec
from commsched.transport.links import TransferKey

log = logging.getLogger("commsched")

#: DATA datagrams sent per turn of the I/O loop, over every destination (so that receiving keeps up).
SENDS_PER_TURN = 256
#: This host's queue of a path's datagrams (:func:`~commsched.transport.dlcp.udp.queued_bytes`) holds at most
#: this many pacer bursts: one leaving, one waiting (module docstring, "This host's queue").
HOST_QUEUE_BURSTS = 2
#: How soon the I/O loop looks again at a full host queue: when half of it will have left at the rate the peers
#: have been receiving (so that a burst's worth is still queued when the loop wakes), within these bounds; the
#: least when no rate is known yet (datagrams arriving wake it sooner).
HOST_QUEUE_POLL_S = (0.0002, 0.001)
#: Bytes a datagram adds to its payload: DLCP's header and MAC (IP and UDP come on top).
FRAMING_BYTES = HEADER.size + MAC_BYTES
Slot = tuple[int, TransferKey]
_RECENT = 4096  # finished sends remembered, to tell a control message's second copy from a stranger's


class Outbound:
    """Posted sends and their pacing, batching and spraying (module docstring); runs under the link's lock."""

    def __init__(
        self, rank: int, world: int, codec: Codec, stats: LinkStats, messages: Messages, sockets: LinkSockets,
        peers: Sequence[Endpoints], *, timeout_s: float, rate: RateParams, drop: Callable[[int, int], bool] | None,
        now: float,
    ) -> None:  # fmt: skip
        self.rank, self.codec, self.stats, self.timeout_s = rank, codec, stats, timeout_s
        self._messages, self._drop = messages, drop
        self._paths = list(sockets.data)
        self._peers = list(peers)
        #: per local path: the socket takes GSO sends (cleared if a route refuses one)
        self.gso = list(sockets.gso)
        self.rates = [RateControl(rate, now) for _ in range(world)]
        #: the most bytes of one path's datagrams left in this host's queue before a turn sends more
        self.host_queue_limit = HOST_QUEUE_BURSTS * rate.burst_bytes
        #: the last turn sent nothing because this host's queue was full: the I/O loop looks again after this long
        self.host_queue_wait_s = 0.0
        self.sends: dict[Slot, SendSlot] = {}
        #: while True, :meth:`finish` leaves the send to :meth:`finish_deferred` (a thread other than the I/O
        #: thread is sending: the transfer's callbacks must not run there, :meth:`Engine.post
        #: <commsched.transport.dlcp.engine.Engine.post>`)
        self.deferring = False
        self._deferred: list[tuple[SendSlot, str | None]] = []
        #: the sends finished last (at most _RECENT), so a control message's second copy is known as one
        self._finished: OrderedDict[Slot, None] = OrderedDict()

    # ---- sends posted and ended ----

    def post(self, slot: SendSlot, now: float) -> None:
        """Register a send (ValueError if one with its key is pending); an empty one finishes at once."""
        k = (slot.peer, slot.key)
        if k in self.sends:
            raise ValueError(f"dlcp: a send to rank {slot.peer} with key {slot.key} is already pending")
        slot.deadline_s = now + self.timeout_s
        self.sends[k] = slot
        if slot.state.done:
            self.finish(slot)

    def cancel(self, slot: SendSlot) -> None:
        if self.sends.get((slot.peer, slot.key)) is slot:
            self.finish(slot, error="cancelled")

    def finish(self, slot: SendSlot, error: str | None = None) -> None:
        if self.deferring:
            self._deferred.append((slot, error))
            return
        slot.state.on_stop()
        k = (slot.peer, slot.key)
        del self.sends[k]
        self._finished[k] = None
        if len(self._finished) > _RECENT:
            self._finished.popitem(last=False)
        if slot.transfer is not None:
            slot.transfer.finish(error=error)

    def finish_deferred(self) -> None:
        """Finish the sends :meth:`finish` left while :attr:`deferring` (those still pending)."""
        if not self._deferred:
            return
        deferred, self._deferred = self._deferred, []
        for slot, error in deferred:
            if self.sends.get((slot.peer, slot.key)) is slot:
                self.finish(slot, error)

    def fail_all(self, error: str) -> None:
        slots = list(self.sends.values())
        self.sends.clear()
        for slot in slots:
            if slot.transfer is not None:
                slot.transfer.finish(error=error)

    def recently_finished(self, peer: int, key: TransferKey) -> bool:
        """A send to ``peer`` with ``key`` finished lately (among the last :data:`_RECENT`)."""
        return (peer, key) in self._finished

    def find(self, peer: int, key: TransferKey, total: int, dtype: int) -> SendSlot | None:
        """The pending send a control message names, if its size and dtype match."""
        send = self.sends.get((peer, key))
        if send is None or (send.numel, send.dtype) != (total, dtype):
            return None
        return send

    # ---- timers ----

    def sleep_s(self, now: float) -> float:
        """How long until the pacer lets a pending send go (INF: none pending or every window full)."""
        return min([self.rates[s.peer].delay_s(now) for s in self.sends.values() if s.state.pending],
                   default=float("inf"))  # fmt: skip

    def tick(self, now: float) -> None:
        """Rate timers; sends past their deadline fail; probes that are due go out."""
        for peer, rate in enumerate(self.rates):
            if peer != self.rank:
                rate.on_timer(now)
        for send in list(self.sends.values()):
            if now >= send.deadline_s:
                self.finish(send, error=f"no STOP from the receiver within {self.timeout_s} s")
            elif not send.state.pending and send.state.wake_s <= now:
                acts: list[Action] = []
                send.state.next_packets(now, 0, acts)
                self._messages.emit(send.peer, acts, send)

    # ---- out ----

    def send(self, now: float) -> None:
        """Send what the pacers allow, at most :data:`SENDS_PER_TURN` datagrams."""
        pending: dict[int, list[SendSlot]] = {}
        for send in self.sends.values():
            if send.state.pending:
                pending.setdefault(send.peer, []).append(send)
        budget = SENDS_PER_TURN
        self.host_queue_wait_s = 0.0
        if not pending:  # nothing to send: no system call to read the queue
            return
        # bytes this host's queue may still take, over every path (module docstring, "This host's queue")
        queue_limit = self.host_queue_limit * len(self._paths)
        room = queue_limit - sum(udp.queued_bytes(sock) for sock in self._paths)
        if room <= 0:
            self.stats.host_queue_full += 1
            leaving = sum(rate.delivery_bytes_per_s for rate in self.rates)
            least, most = HOST_QUEUE_POLL_S
            half_s = (queue_limit / 2 - room) / leaving if leaving > 0 else least
            self.host_queue_wait_s = min(most, max(least, half_s))
        while pending and budget > 0 and room > 0:
            for peer in list(pending):
                slots = pending[peer]
                # a push held behind this rank's pulls left its peer idle at the exchange's end (BENCHMARKS.md,
                # "DLCP re-sends lost datagrams in mid-stream and sends pushes first")
                slot = min(slots, key=lambda s: send_order(s.key.step, s.key.phase, s.prio))  # stable: first posted
                datagram = slot.stride * slot.itemsize + FRAMING_BYTES
                limit = min(budget, udp.batch_limit(datagram) * len(self._paths), math.ceil(room / datagram))
                taken = self._send_some(slot, self.rates[peer], now, limit)
                budget -= taken
                room -= taken * datagram
                if not slot.state.pending:
                    slots.remove(slot)
                    if not slots:
                        del pending[peer]
                elif not taken:  # the pacer or the window holds this destination
                    del pending[peer]

    def _send_some(self, slot: SendSlot, rate: RateControl, now: float, limit: int) -> int:
        """Take up to ``limit`` packets of ``slot`` as the pacer allows, number them, send them; how many taken."""
        slot.classify()  # before its first packet, if left to this thread (DlcpLink.send)
        state, stats, drop = slot.state, self.stats, self._drop
        itemsize = slot.itemsize
        numbered: list[tuple[int, Data]] = []
        acts: list[Action] = []
        taken = 0
        while taken < limit and state.pending and rate.delay_s(now) <= 0:
            acts.clear()
            state.next_packets(now, 1, acts)
            for act in acts:
                if not isinstance(act, Data):
                    self._messages.emit(slot.peer, [act], slot)
                    continue
                taken += 1
                if drop is not None and drop(slot.peer, act.offset):
                    # emulated loss, before the datagram is numbered: the receiver sees no gap and the rate
                    # control no congestion (loss that signals congestion comes from a network that drops)
                    stats.dropped_by_hook += 1
                    stats.resent += act.resend
                    continue
                # on the wire: the payload, DLCP's header and MAC, IPv4 and UDP
                seq = rate.on_send(act.numel * itemsize + FRAMING_BYTES + IPV4_UDP_BYTES, now)
                state.numbered(act.offset, seq)
                numbered.append((seq, act))
        if numbered:
            self._transmit(slot, numbered, now)
        return taken

    def _transmit(self, slot: SendSlot, numbered: list[tuple[int, Data]], now: float) -> None:
        """Send numbered datagrams of ``slot``: one GSO send per (local path, peer path, TOS byte)."""
        local, remote = len(self._paths), self._peers[slot.peer].data
        tos = (tos_byte(slot.prio, False), tos_byte(slot.prio, True))
        groups: dict[tuple[int, int, int], list[tuple[int, Data]]] = {}
        for seq, act in numbered:
            groups.setdefault((seq % local, seq % len(remote), tos[act.important]), []).append((seq, act))
        full = slot.stride * slot.itemsize + FRAMING_BYTES
        k, codec, view, itemsize = slot.key, self.codec, slot.view, slot.itemsize
        stats = self.stats
        for (path, dest, tos_value), group in groups.items():
            if len(group) > 1:  # the tail (the one short datagram a transfer has) goes last in its batch
                group.sort(key=lambda item: item[1].numel != slot.stride)
            parts: list[bytes | memoryview] = []
            for seq, act in group:
                start = act.offset * itemsize
                payload = view[start : start + act.numel * itemsize]
                body, mac = codec.data_parts(k.step, k.task, k.phase, self.rank, slot.prio, act.important,
                                             slot.dtype, seq, act.offset, act.numel, slot.numel, slot.stride,
                                             payload)  # fmt: skip
                parts += (body, mac)
                stats.sent += 1
                stats.resent += act.resend
                stats.sent_bytes += len(payload) + FRAMING_BYTES
            sock, address = self._paths[path], remote[dest]
            if len(group) > 1 and self.gso[path]:
                try:
                    udp.send_batch(sock, parts, tos_value, full, address)
                    stats.send_calls += 1
                    continue
                except BlockingIOError:  # this host's send buffer is full: back-pressure, not loss; they go again
                    self._requeue(slot, group, now)
                    continue
                except OSError as exc:
                    if exc.errno not in udp.GSO_REFUSED:
                        self._lost(slot, group, exc)
                        continue
                    self._gso_refused(path, address, exc)  # and send them one by one, below
            for i, (_seq, act) in enumerate(group):
                try:
                    udp.send_batch(sock, parts[2 * i : 2 * i + 2], tos_value, 0, address)
                    stats.send_calls += 1
                except BlockingIOError:
                    self._requeue(slot, [(_seq, act)], now)
                except OSError as exc:
                    self._lost(slot, [(_seq, act)], exc)

    def _requeue(self, slot: SendSlot, group: list[tuple[int, Data]], now: float) -> None:
        self.stats.send_errors += len(group)
        rate = self.rates[slot.peer]
        for seq, act in reversed(group):  # requeue puts each first: the batch keeps its order
            slot.state.requeue(act.offset)
            rate.on_unsent(seq, now)  # a gap in the numbers the receiver sees that is not a loss

    def _lost(self, slot: SendSlot, group: list[tuple[int, Data]], exc: OSError) -> None:
        """The host refused datagrams: too large for the route (the send fails), or lost as on a broken link."""
        self.stats.send_errors += len(group)
        if exc.errno == errno.EMSGSIZE and self.sends.get((slot.peer, slot.key)) is slot:
            datagram = slot.stride * slot.itemsize + FRAMING_BYTES + IPV4_UDP_BYTES
            self.finish(slot, error=f"datagrams of {datagram} bytes (IP and UDP headers included) do not fit the "
                        f"path MTU toward rank {slot.peer} ({exc.strerror}); give a smaller mtu_bytes")  # fmt: skip

    def _gso_refused(self, path: int, address: tuple[str, int], exc: OSError) -> None:
        self.gso[path] = False
        self.stats.gso_refused += 1
        log.warning("dlcp: the route from path %d to %s refused a UDP GSO send (%s); sending one datagram per "
                    "system call on that path from now on", path, address, exc.strerror or exc)  # fmt: skip
