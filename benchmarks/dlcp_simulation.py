"""DLCP's ns-3 experiment, re-run on the packet-level simulator: FCT and iteration time vs DCTCP and pFabric.

DLCP (arXiv 2008.08445, as secondary sources report it) simulated 144 hosts
at 100 Gbit/s with training traffic plus background flows and compared
flow-completion times against DCTCP and pFabric. No code was published;
this is the same kind of experiment on ``commsched.sim.packet``:

* **FCT**: one round of parameter-server traffic (every worker pushes its
  gradient slice to each of ``servers`` colocated servers, which then send
  the sums back: an incast each way), started at once, on a leaf-spine
  fabric with web-search background flows at ``load``. Training flows run
  on the transport under test (DLCP with ``loss_bound``, on the
  ``dlcp`` transport), background flows on DCTCP for DLCP and on the
  transport itself for DCTCP and pFabric. Average and p99 FCT of the
  training flows and of the background flows.
* **Iteration time**: the zoo's ``--model`` trained with ``ps`` (DCTCP,
  pFabric) and ``dlcp`` ``mode=ps`` on the same fabric and background.

    python benchmarks/dlcp_simulation.py                           # 8 hosts at 10 Gbit/s: a minute
    python benchmarks/dlcp_simulation.py --hosts 144 --gbps 100     # the paper's scale (see docs/reproduction.md)

Settings common to the three runs: leaf-spine with ``hosts / 4`` hosts per
leaf (4 leaves) and 2 spines at the host rate, 1 µs per link, 9000-byte
MTU, 1 MB of buffer per switch port, ``priority_classes`` bands, RED/ECN at
K = ``k_bytes`` (DCTCP's and DLCP's marking threshold; pFabric's runs use
pFabric queues instead), seed 0. Everything is deterministic.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np

from commsched import zoo
from commsched.cluster import Cluster
from commsched.sim.packet import PacketConfig, RedParams, build
from commsched.sim.packet.background import background_flows
from commsched.sim.packet.run import simulate_packet
from commsched.sim.packet.scenario import Flow, run_flows


def cluster(hosts: int, gbps: float, servers: int) -> Cluster:
    nic = {"bandwidth_gbps": gbps, "latency_us": 2.0}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    return Cluster.from_dict(
        {"name": f"{hosts}x{gbps:g}G", "nodes": nodes, "servers": {"count": servers, "colocated": True}}
    )


def configs(args: argparse.Namespace) -> dict[str, PacketConfig]:
    base = PacketConfig(
        topology="leaf_spine",
        hosts_per_leaf=max(1, args.hosts // 4),
        spines=2,
        fabric_latency_us=1.0,
        buffer_bytes=1_000_000,
        priority_classes=args.priority_classes,
        seed=0,
    )
    red = RedParams(min_bytes=args.k_bytes, max_bytes=args.k_bytes)
    dlcp = replace(base, transport="dctcp", red=red)
    dlcp = replace(dlcp, dlcp=replace(dlcp.dlcp, initial_gbps=args.gbps))  # DCQCN-like: start at line rate
    return {
        "dctcp": replace(base, transport="dctcp", red=red),
        "pfabric": replace(base, transport="pfabric", pfabric=True),
        "dlcp": dlcp,
    }


def stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values) * 1e3
    return {"flows": len(values), "avg_ms": float(arr.mean()), "p99_ms": float(np.percentile(arr, 99))}


def fct_run(name: str, config: PacketConfig, args: argparse.Namespace) -> dict[str, Any]:
    hosts = cluster(args.hosts, args.gbps, args.servers)
    fabric = build(hosts, config).fabric
    gradient = zoo.load(args.model).total_bytes
    part = -(-gradient // args.servers)
    bound = args.loss_bound if name == "dlcp" else 0.0
    training = [
        Flow(w, s, part, 0.0, 1, bound, "dlcp" if name == "dlcp" else "")
        for w in range(args.hosts)
        for s in range(args.servers)
        if w != s
    ]
    training += [
        Flow(s, w, part, 0.0, 1, 0.0, "dlcp" if name == "dlcp" else "")
        for w in range(args.hosts)
        for s in range(args.servers)
        if w != s
    ]
    back = background_flows(
        list(range(args.hosts)), args.load, args.gbps, "web_search", args.duration_s, 0, config.priority_classes - 1
    )
    start = time.perf_counter()
    results = run_flows(fabric, training + back, config)
    wall_s = time.perf_counter() - start
    train = [r.fct_s for r in results[: len(training)]]
    other = [r.fct_s for r in results[len(training) :]]
    return {
        "transport": name,
        "training": stats(train),
        "background": stats(other) if other else None,
        "drops": sum(r.drops for r in results),
        "events": fabric.processed,
        "wall_s": wall_s,
    }


def iteration_run(name: str, config: PacketConfig, args: argparse.Namespace) -> dict[str, Any]:
    hosts = cluster(args.hosts, args.gbps, args.servers)
    workload = zoo.load(args.model)
    config = replace(config, background_load=args.load, background_duration_s=args.duration_s)
    start = time.perf_counter()
    if name == "dlcp":
        run = simulate_packet(workload, hosts, "dlcp", config, args.iterations, 1, trace=False, mode="ps",
                              loss_bound=args.loss_bound)  # fmt: skip
    else:
        run = simulate_packet(workload, hosts, "ps", config, args.iterations, 1, trace=False)
    wall_s = time.perf_counter() - start
    each = run.result.iteration_ms_each
    return {
        "transport": name,
        "iteration_ms": run.result.iteration_ms,
        "iteration_max_ms": max(each),
        "unvalidated": run.result.unvalidated,
        "dlcp": run.network.dlcp_stats() if name == "dlcp" else None,
        "events": run.network.fabric.processed,
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--gbps", type=float, default=10.0)
    parser.add_argument("--servers", type=int, default=1, help="colocated parameter servers (the incast degree)")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--load", type=float, default=0.3, help="background load per host link")
    parser.add_argument("--duration-s", type=float, default=0.01, help="background flows arrive over this long")
    parser.add_argument("--loss-bound", type=float, default=0.1, help="DLCP's bound (the paper's evaluation: 10 %%)")
    parser.add_argument("--k-bytes", type=int, default=90_000, help="RED/ECN threshold K")
    parser.add_argument("--priority-classes", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--skip-iterations", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    out: dict[str, Any] = {"settings": vars(args), "fct": [], "iteration": []}
    for name, config in configs(args).items():
        row = fct_run(name, config, args)
        out["fct"].append(row)
        t, b = row["training"], row["background"] or {"avg_ms": float("nan"), "p99_ms": float("nan")}
        print(f"FCT  {name:8s} training avg {t['avg_ms']:.3f} ms p99 {t['p99_ms']:.3f} ms | background avg "
              f"{b['avg_ms']:.3f} ms p99 {b['p99_ms']:.3f} ms | drops {row['drops']} | {row['events']} events "
              f"in {row['wall_s']:.1f} s", flush=True)  # fmt: skip
    if not args.skip_iterations:
        for name, config in configs(args).items():
            row = iteration_run(name, config, args)
            out["iteration"].append(row)
            print(f"iter {name:8s} median {row['iteration_ms']:.2f} ms, max {row['iteration_max_ms']:.2f} ms | "
                  f"{row['events']} events in {row['wall_s']:.1f} s", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
