"""pFabric's switch queue (Alizadeh et al., SIGCOMM'13) in logarithmic time per packet.

A pFabric port serves the most urgent packet first (the smallest ``prio``:
the sender's remaining flow size), or rather the oldest queued packet of
that packet's connection, so that a flow is never reordered; when its buffer
is full it drops the least urgent packet (the arriving one if none is less
urgent). Ties: the most urgent is the first to have arrived among equals,
the least urgent the last, in the highest band.

Scanning the queue for both, as a list of packets would, costs its length
per packet; at 144 hosts (``benchmarks/dlcp_simulation.py --hosts 144``) the
pFabric run took five times DCTCP's time, most of it in those scans. Here
each band keeps a heap of its packets by ``(prio, arrival)`` and each
connection's packets in arrival order, and the port a heap of all its
packets by ``(prio, band, arrival)`` for the drops. A packet that leaves
stays in the heaps it was in until it reaches their top (lazy deletion): an
entry is current only while the packet's ``qseq`` is the one it was queued
with (numbers from the fabric, unique across ports); a heap that holds more
than twice its packets is rebuilt without the stale entries (the drop heap's
bottom fills with the urgent packets that left, which never reach its top).
Same decisions, same ties, as the scan (``tests/sim/packet/test_queues.py``
compares both on random traffic).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commsched.sim.packet.fabric import Packet

#: A heap is rebuilt without its stale entries once it holds more than twice its packets and this many more.
COMPACT_SLACK = 64


class PfabricBand:
    """One strict-priority band of a pFabric port: ``count`` packets, the most urgent connection's oldest first."""

    __slots__ = ("_fifo", "_urgent", "count")

    def __init__(self) -> None:
        self._urgent: list[tuple[float, int, Packet]] = []  # (prio, qseq, packet): a min-heap
        self._fifo: dict[Any, deque[Packet]] = {}  # connection -> its packets here, oldest first
        self.count = 0

    def push(self, pkt: Packet, qseq: int) -> None:
        pkt.qseq = qseq
        urgent = self._urgent
        if len(urgent) > 2 * self.count + COMPACT_SLACK:
            urgent[:] = [e for e in urgent if e[2].qseq == e[1]]
            heapq.heapify(urgent)
        heapq.heappush(urgent, (pkt.prio, qseq, pkt))
        fifo = self._fifo.get(pkt.conn)
        if fifo is None:
            fifo = self._fifo[pkt.conn] = deque()
        fifo.append(pkt)
        self.count += 1

    def pop(self) -> Packet | None:
        """Take the oldest packet of the connection whose packet is the most urgent, or None."""
        urgent = self._urgent
        while urgent and urgent[0][2].qseq != urgent[0][1]:
            heapq.heappop(urgent)  # left already
        if not urgent:
            return None
        conn = urgent[0][2].conn
        fifo = self._fifo[conn]
        pkt = fifo.popleft()
        if not fifo:
            del self._fifo[conn]
        pkt.qseq = -1
        self.count -= 1
        return pkt

    def remove(self, pkt: Packet) -> None:
        """Take ``pkt`` out (a drop); usually its connection's oldest, the least urgent of its packets."""
        fifo = self._fifo[pkt.conn]
        if fifo[0] is pkt:
            fifo.popleft()
        else:
            fifo.remove(pkt)
        if not fifo:
            del self._fifo[pkt.conn]
        pkt.qseq = -1
        self.count -= 1


class PfabricQueue:
    """The bands of one pFabric port, and the least urgent of all their packets for drops."""

    __slots__ = ("_least", "bands", "count")

    def __init__(self, bands: int) -> None:
        self.bands = [PfabricBand() for _ in range(bands)]
        self._least: list[tuple[float, int, int, Packet]] = []  # (-prio, -band, -qseq, packet): a max-heap
        self.count = 0

    def push(self, pkt: Packet, band: int, qseq: int) -> None:
        self.bands[band].push(pkt, qseq)
        least = self._least
        if len(least) > 2 * self.count + COMPACT_SLACK:
            least[:] = [e for e in least if e[3].qseq == -e[2]]
            heapq.heapify(least)
        heapq.heappush(least, (-pkt.prio, -band, -qseq, pkt))
        self.count += 1

    def pop(self) -> Packet | None:
        for band in self.bands:
            if band.count:
                self.count -= 1
                return band.pop()
        return None

    def least_urgent(self) -> Packet | None:
        """The packet a full buffer drops first (still queued), or None if empty."""
        least = self._least
        while least and least[0][3].qseq != -least[0][2]:
            heapq.heappop(least)
        return least[0][3] if least else None

    def drop_least_urgent(self) -> Packet:
        """Take out the packet :meth:`least_urgent` names (call it first)."""
        _, band, _, pkt = heapq.heappop(self._least)
        self.bands[-band].remove(pkt)
        self.count -= 1
        return pkt
