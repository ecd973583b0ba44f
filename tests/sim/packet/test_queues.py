from __future__ import annotations

import random

from commsched.sim.packet import PacketConfig, RedParams, TcpParams
from commsched.sim.packet.fabric import Fabric, Packet
from commsched.sim.packet.pfabric import COMPACT_SLACK, PfabricQueue
from commsched.sim.packet.scenario import Flow, run_flows

from packet_builders import fabric


class _Sink:
    """A connection stand-in that counts what a port drops, marks and delivers."""

    def __init__(self) -> None:
        self.drops = 0
        self.marks = 0
        self.delivered: list[Packet] = []

    def deliver(self, pkt: Packet) -> None:
        self.delivered.append(pkt)


def test_strict_priority_starves_the_low_class_while_the_high_class_has_data() -> None:
    # two senders into one receiver: class 0 (high) and class 1 (low) both saturate the receiver's port
    config = PacketConfig(priority_classes=2, buffer_bytes=10_000_000)
    fab = fabric(3, config)
    high, low = run_flows(fab, [Flow(0, 2, 2_000_000, cls=0), Flow(1, 2, 2_000_000, cls=1)], config)
    alone = run_flows(fabric(3, config), [Flow(0, 2, 2_000_000)], config)[0]
    one_packet_s = (config.tcp.segment_bytes + config.tcp.header_bytes) / 1.25e9
    # non-preemptive: a low packet already on the wire delays the high class by at most one packet time
    assert alone.fct_s <= high.fct_s <= alone.fct_s + one_packet_s + 1e-12
    assert low.fct_s > 1.9 * alone.fct_s  # the low class got (almost) nothing until the high one was done


def test_red_drops_only_packets_that_are_not_ecn_capable_below_the_max_threshold() -> None:
    red = RedParams(min_bytes=10_000, max_bytes=100_000, max_p=1.0)
    fab = Fabric(PacketConfig(red=red, buffer_bytes=1_000_000))
    port = fab.add_port("p", 1.0, 0.0)  # the first packet is on the wire; nothing else leaves during the test
    sink = _Sink()
    rng = random.Random(0)
    seen: list[tuple[Packet, int]] = []
    for i in range(150):
        pkt = Packet(i, 1000, 1000, 0.0, ect=rng.random() < 0.5)
        pkt.conn = sink
        seen.append((pkt, port.queued_bytes))
        port.enqueue(pkt)
    queued = {id(p) for band in port.bands for p in band}
    below_min = [p for p, q in seen[1:] if q < 10_000]
    between = [p for p, q in seen[1:] if 10_000 <= q < 100_000]
    assert all(id(p) in queued and not p.ce for p in below_min)
    assert all(id(p) in queued for p in between if p.ect)  # ECN-capable: marked, never dropped
    dropped = [p for p in between if id(p) not in queued]
    marked = [p for p, _ in seen if p.ce]
    assert dropped and marked and not any(p.ect for p in dropped) and all(p.ect for p in marked)
    assert port.drops == sink.drops == len([p for p, _ in seen[1:] if id(p) not in queued])
    assert port.marks == len(marked)


def test_spraying_splits_packets_evenly_over_equal_paths() -> None:
    config = PacketConfig(topology="leaf_spine", hosts_per_leaf=2, spines=4, load_balancing="spray", seed=3)
    fab = fabric(4, config)
    run_flows(fab, [Flow(0, 2, 20_000_000)], config)
    counts = [fab.ports[f"leaf0>spine{s}"].tx_bytes for s in range(4)]
    mean = sum(counts) / 4
    assert all(abs(c - mean) < 0.08 * mean for c in counts)  # about 2,200 packets, chosen at random


def test_ecmp_keeps_a_connection_on_one_path() -> None:
    config = PacketConfig(topology="leaf_spine", hosts_per_leaf=2, spines=4, load_balancing="ecmp", seed=3)
    fab = fabric(4, config)
    run_flows(fab, [Flow(0, 2, 2_000_000)], config)
    used = [s for s in range(4) if fab.ports[f"leaf0>spine{s}"].tx_bytes]
    assert len(used) == 1


def test_a_tcp_flow_recovers_from_drops_and_delivers_everything() -> None:
    config = PacketConfig(buffer_bytes=30_000, tcp=TcpParams(segment_bytes=1448, header_bytes=52))
    fab = fabric(5, config)
    results = run_flows(fab, [Flow(s, 4, 1_000_000) for s in range(4)], config)
    assert sum(r.drops for r in results) > 0 and sum(r.retransmits for r in results) > 0
    assert fab.injected_bytes == fab.delivered_bytes + fab.dropped_bytes


class _ScanQueue:
    """pFabric's rules by scanning a list per band (the port's old code): the reference for PfabricQueue."""

    def __init__(self, bands: int) -> None:
        self.bands: list[list[Packet]] = [[] for _ in range(bands)]

    def push(self, pkt: Packet, band: int) -> None:
        self.bands[band].append(pkt)

    def pop(self) -> Packet | None:
        for band in self.bands:
            if band:
                best = min(band, key=lambda q: q.prio)  # the first of the most urgent...
                i = next(i for i, q in enumerate(band) if q.conn is best.conn)  # ...its connection's oldest
                return band.pop(i)
        return None

    def least_urgent(self) -> Packet | None:
        worst: tuple[float, int, int] | None = None
        for b, band in enumerate(self.bands):
            for i, q in enumerate(band):
                if worst is None or q.prio >= worst[0]:
                    worst = (q.prio, b, i)
        return None if worst is None else self.bands[worst[1]][worst[2]]

    def drop_least_urgent(self) -> Packet:
        victim = self.least_urgent()
        assert victim is not None
        for band in self.bands:
            if victim in band:
                band.remove(victim)
        return victim


def test_the_pfabric_queue_decides_as_a_scan_of_every_queued_packet_would() -> None:
    # random traffic with many equal priorities (ties), several connections and bands, drops and pops mixed
    rng = random.Random(7)
    conns = [_Sink() for _ in range(6)]
    fast, scan = PfabricQueue(3), _ScanQueue(3)
    qseq = 0
    queued: list[Packet] = []
    for _ in range(20_000):
        action = rng.random()
        if action < 0.5 or not queued:
            pkt = Packet(0, 100, 100, 0.0, prio=float(rng.randrange(8)))
            pkt.conn = rng.choice(conns)
            band = rng.randrange(3)
            qseq += 1
            fast.push(pkt, band, qseq)
            scan.push(pkt, band)
            queued.append(pkt)
        elif action < 0.85:
            got = fast.pop()
            assert got is scan.pop()
            queued.remove(got)
        else:
            victim = fast.least_urgent()
            assert victim is scan.least_urgent()
            assert fast.drop_least_urgent() is victim and scan.drop_least_urgent() is victim
            queued.remove(victim)
        assert fast.count == len(queued) == sum(b.count for b in fast.bands)
    # the heaps' stale entries stay bounded: rebuilt once they outnumber the packets
    assert len(fast._least) <= 2 * fast.count + COMPACT_SLACK + 1
