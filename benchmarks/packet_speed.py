"""Packet events per second of the packet-level network core, on one core.

Pure Python by default; after ``python -m commsched.sim.packet.compile`` the
same source compiled by mypyc (the first line printed says which).

A 16-host all-to-all (240 flows of 1 MB, DCTCP, one switch, 10 Gbit/s), an
8 -> 1 incast (8 x 20 MB, NewReno, drop-tail), and DLCP on a 16-host leaf-spine
(60 flows of 2 MB at a 5 % bound, RED at 90 kB, 5 priority bands, datagrams
sprayed over 2 spines; its state machines run per datagram): every event is a
packet arriving at a hop, a port finishing a packet, or a transport timer.
Wall and CPU time are the median of 3 runs (CPU time: this process's, which a
loaded machine inflates less than wall time).

    python benchmarks/packet_speed.py
    python benchmarks/packet_speed.py --only dlcp
"""

from __future__ import annotations

import argparse
import statistics
import time

from commsched.cluster import Cluster
from commsched.sim.packet import COMPILED, PacketConfig, RedParams, TcpParams, build
from commsched.sim.packet.scenario import Flow, run_flows

TCP = TcpParams(segment_bytes=1448, header_bytes=54)


def _cluster(hosts: int, config: PacketConfig) -> Cluster:
    # 10 Gbit/s; 4 µs one way on one switch (2 µs per half), 10 µs on the leaf-spine (the tests' fabrics)
    nic = {"bandwidth_gbps": 10.0, "latency_us": 4.0 if config.topology == "single_switch" else 10.0}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    return Cluster.from_dict({"name": f"speed-{hosts}", "nodes": nodes})


def run(name: str, hosts: int, flows: list[Flow], config: PacketConfig, repeats: int = 3) -> None:
    rates, walls, cpus = [], [], []
    events = 0
    for _ in range(repeats):
        fabric = build(_cluster(hosts, config), config).fabric
        start, cpu = time.perf_counter(), time.process_time()
        run_flows(fabric, flows, config)
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - start)
        events = fabric.processed
        rates.append(events / cpus[-1])
    wall, cpu, rate = statistics.median(walls), statistics.median(cpus), statistics.median(rates)
    print(f"| {name} | {events:,} | {wall:.2f} s | {cpu:.2f} s | {rate / 1e3:,.0f} k |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tcp", "dlcp"), help="run only the TCP scenarios or only DLCP's")
    args = parser.parse_args()
    print(f"core: {'compiled (mypyc)' if COMPILED else 'pure Python'}\n")
    print("| scenario | events | wall | CPU | events per CPU s |")
    print("|---|---:|---:|---:|---:|")
    if args.only != "dlcp":
        k = 30_000
        dctcp = PacketConfig(transport="dctcp", red=RedParams(min_bytes=k, max_bytes=k), buffer_bytes=150_000, tcp=TCP)
        a2a = [Flow(s, d, 1_000_000) for s in range(16) for d in range(16) if s != d]
        run("all-to-all 16 hosts, DCTCP", 16, a2a, dctcp)
        reno = PacketConfig(transport="tcp", buffer_bytes=150_000, tcp=TCP)
        run("incast 8 -> 1, NewReno", 9, [Flow(s, 8, 20_000_000) for s in range(8)], reno)
    if args.only != "tcp":
        red = RedParams(min_bytes=90_000, max_bytes=90_000)
        dlcp = PacketConfig(
            transport="dlcp", red=red, priority_classes=5, topology="leaf_spine", hosts_per_leaf=4, spines=2
        )
        flows = [
            Flow(s, d, 2_000_000, cls=(s + d) % 4, loss_bound=0.05)
            for s in range(16)
            for d in range(0, 16, 5)
            if s != d
        ]
        run("DLCP 16 hosts, leaf-spine, 5 bands", 16, flows, dlcp)


if __name__ == "__main__":
    main()
