"""One output port of the packet-level network: its queue and the link behind it.

Queueing (:meth:`Port.enqueue`): the packet's class picks a strict-priority
band; RED/ECN (if configured) marks an ECN-capable packet or drops one that
is not; a full buffer drops the packet (drop-tail), or under pFabric drops
the least urgent packet in the buffer (:mod:`commsched.sim.packet.pfabric`).
Dequeue takes the first packet of the most urgent non-empty band (pFabric:
the most urgent connection's oldest packet). A packet is serialised at the
port's rate and handed to :meth:`Fabric.arrive <commsched.sim.packet.fabric.Fabric.arrive>`
one propagation delay after its last bit left; the fabric
(:mod:`commsched.sim.packet.fabric`) owns the clock and the event loop.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from commsched.sim.packet.config import RedParams
from commsched.sim.packet.pfabric import PfabricQueue

if TYPE_CHECKING:
    from commsched.sim.packet.fabric import Fabric, Packet


class Port:
    """One output port: its queue (bands, RED/ECN, drop-tail or pFabric) and the link behind it.

    ``acks``: None, or the queue of pure ACKs a host-side port sends before
    any queued data (``PacketConfig.acks_first``).

    Counters: ``tx_bytes`` sent, ``drops``/``marks`` packets, ``busy_lo`` /
    ``busy_hi`` the merged transmission periods (for utilisation; flat arrays
    of 16 bytes a period: as lists of ``[lo, hi]`` lists, about 120, the
    periods took 1 of a 16-host iteration run's 1.3 GB and grew past 6 GB at
    144 hosts); ``samples`` ``(time_s, queued bytes)`` when the fabric records
    queues.
    """

    __slots__ = (
        "_red_avg",
        "acks",
        "bands",
        "buffer_bytes",
        "busy_hi",
        "busy_lo",
        "busy_until",
        "drops",
        "fabric",
        "marks",
        "name",
        "pending",
        "pf",
        "prop_s",
        "queued_bytes",
        "rate_bytes_per_s",
        "red",
        "samples",
        "tx_bytes",
    )

    def __init__(
        self,
        fabric: Fabric,
        name: str,
        rate_bytes_per_s: float,
        prop_s: float,
        buffer_bytes: float,
        classes: int,
        red: RedParams | None,
        pfabric: bool,
        acks_first: bool = False,
    ) -> None:
        self.fabric = fabric
        self.name = name
        self.rate_bytes_per_s = rate_bytes_per_s
        self.prop_s = prop_s
        self.buffer_bytes = buffer_bytes
        self.bands: list[deque[Packet]] = [deque() for _ in range(classes)]
        self.acks: deque[Packet] | None = deque() if acks_first else None
        self.red = red
        self.pf = PfabricQueue(classes) if pfabric else None  # then ``bands`` stays empty
        self._red_avg = 0.0
        self.queued_bytes = 0
        self.busy_until = 0.0
        self.pending = False
        self.tx_bytes = 0
        self.drops = 0
        self.marks = 0
        self.busy_lo = array("d")
        self.busy_hi = array("d")
        self.samples: list[tuple[float, int]] | None = [] if fabric.config.record_queues else None

    # ---- queueing ----

    def enqueue(self, pkt: Packet) -> None:
        fabric = self.fabric
        now = fabric.now
        if not self.queued_bytes and not self.pending and now >= self.busy_until:
            self._transmit(pkt, now)  # an idle port: no queue, no AQM
            return
        size = pkt.size_bytes
        if pkt.is_ack and self.acks is not None:  # ahead of the data (a host's fq serves the sparse ACK flow first)
            self.acks.append(pkt)
            self._queued(size, now)
            return
        red = self.red
        if red is not None and self._red_hit(red, pkt):
            if pkt.ect and not (red.hard_drop and self.queued_bytes >= red.max_bytes):
                pkt.ce = True
                self.marks += 1
                pkt.conn.marks += 1
            else:
                self._drop(pkt)
                return
        pf = self.pf
        if self.queued_bytes + size > self.buffer_bytes and (pf is None or not self._pfabric_evict(pf, pkt)):
            self._drop(pkt)
            return
        band = pkt.cls if pkt.cls < len(self.bands) else len(self.bands) - 1
        if pf is None:
            self.bands[band].append(pkt)
        else:
            fabric.qseq += 1
            pf.push(pkt, band, fabric.qseq)
        self._queued(size, now)

    def _queued(self, size: int, now: float) -> None:
        """A packet of ``size`` bytes joined the queue: count it, sample, and make sure a transmission is due."""
        self.queued_bytes += size
        if self.samples is not None:
            self.samples.append((now, self.queued_bytes))
        if not self.pending:
            self.pending = True
            self.fabric.schedule(self.busy_until if self.busy_until > now else now, self._tx_done, None)

    def _red_hit(self, red: RedParams, pkt: Packet) -> bool:
        q = self.queued_bytes
        avg = q if red.weight >= 1.0 else (1 - red.weight) * self._red_avg + red.weight * q
        self._red_avg = avg
        if avg < red.min_bytes:
            return False
        if avg >= red.max_bytes:
            return True
        p = red.max_p * (avg - red.min_bytes) / (red.max_bytes - red.min_bytes)
        return self.fabric.rng.random() < p

    def _drop(self, pkt: Packet) -> None:
        self.drops += 1
        pkt.conn.drops += 1
        self.fabric.dropped_bytes += pkt.size_bytes

    def _pfabric_evict(self, pf: PfabricQueue, pkt: Packet) -> bool:
        """Make room for ``pkt`` by dropping less urgent packets; False if ``pkt`` is the least urgent."""
        need = self.queued_bytes + pkt.size_bytes - self.buffer_bytes
        while need > 0:
            victim = pf.least_urgent()
            if victim is None or victim.prio <= pkt.prio:
                return False
            pf.drop_least_urgent()
            self.queued_bytes -= victim.size_bytes
            need -= victim.size_bytes
            self._drop(victim)
        return True

    def _dequeue(self) -> Packet | None:
        if self.acks:
            return self.acks.popleft()
        if self.pf is not None:
            return self.pf.pop()  # the most urgent connection's oldest packet (pfabric.py)
        for band in self.bands:
            if band:
                return band.popleft()
        return None

    def _tx_done(self, _: None) -> None:
        self.pending = False
        pkt = self._dequeue()
        if pkt is None:
            return
        now = self.fabric.now
        self.queued_bytes -= pkt.size_bytes
        if self.samples is not None:
            self.samples.append((now, self.queued_bytes))
        self._transmit(pkt, now)
        if self.queued_bytes:
            self.pending = True
            self.fabric.schedule(self.busy_until, self._tx_done, None)

    def _transmit(self, pkt: Packet, now: float) -> None:
        size = pkt.size_bytes
        end = now + size / self.rate_bytes_per_s
        busy_hi = self.busy_hi
        if busy_hi and busy_hi[-1] >= now:
            busy_hi[-1] = end
        else:
            self.busy_lo.append(now)
            busy_hi.append(end)
        self.busy_until = end
        self.tx_bytes += size
        fabric = self.fabric
        fabric.schedule(end + self.prop_s, fabric.arrive, pkt)

    def busy_within(self, start_s: float, end_s: float) -> float:
        """Seconds in ``[start_s, end_s]`` during which the port was transmitting."""
        lo = np.frombuffer(self.busy_lo, dtype=np.float64)
        hi = np.frombuffer(self.busy_hi, dtype=np.float64)
        return float(np.maximum(np.minimum(hi, end_s) - np.maximum(lo, start_s), 0.0).sum())
