"""Packet events per second of the packet-level network core, on one core.

Pure Python by default; after ``python -m commsched.sim.packet.compile`` the
same source compiled by mypyc (the first line printed says which).

A 16-host all-to-all (240 flows of 1 MB, DCTCP, one switch, 10 Gbit/s) and an
8 -> 1 incast (8 x 20 MB, NewReno, drop-tail): every event is a packet arriving at a
hop, a port finishing a packet, or a transport timer.

    python benchmarks/packet_speed.py
"""

from __future__ import annotations

import statistics
import time

from commsched.cluster import Cluster
from commsched.sim.packet import COMPILED, PacketConfig, RedParams, TcpParams, build
from commsched.sim.packet.scenario import Flow, run_flows

TCP = TcpParams(segment_bytes=1448, header_bytes=54)


def _cluster(hosts: int) -> Cluster:
    nic = {"bandwidth_gbps": 10.0, "latency_us": 4.0}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    return Cluster.from_dict({"name": f"speed-{hosts}", "nodes": nodes})


def run(name: str, hosts: int, flows: list[Flow], config: PacketConfig, repeats: int = 3) -> None:
    rates, walls = [], []
    events = 0
    for _ in range(repeats):
        fabric = build(_cluster(hosts), config).fabric
        start = time.perf_counter()
        run_flows(fabric, flows, config)
        wall = time.perf_counter() - start
        events = fabric.processed
        walls.append(wall)
        rates.append(events / wall)
    print(f"| {name} | {events:,} | {statistics.median(walls):.2f} s | {statistics.median(rates) / 1e3:,.0f} k |")


def main() -> None:
    print(f"core: {'compiled (mypyc)' if COMPILED else 'pure Python'}\n")
    print("| scenario | events | wall (median of 3) | events/s |")
    print("|---|---:|---:|---:|")
    k = 30_000
    dctcp = PacketConfig(transport="dctcp", red=RedParams(min_bytes=k, max_bytes=k), buffer_bytes=150_000, tcp=TCP)
    a2a = [Flow(s, d, 1_000_000) for s in range(16) for d in range(16) if s != d]
    run("all-to-all 16 hosts, DCTCP", 16, a2a, dctcp)
    reno = PacketConfig(transport="tcp", buffer_bytes=150_000, tcp=TCP)
    run("incast 8 -> 1, NewReno", 9, [Flow(s, 8, 20_000_000) for s in range(8)], reno)


if __name__ == "__main__":
    main()
