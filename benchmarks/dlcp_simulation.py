"""DLCP's ns-3 experiment, re-run on the packet-level simulator: FCT and iteration time vs DCTCP and pFabric.

DLCP (arXiv 2008.08445, as secondary sources report it) simulated 144 hosts
at 100 Gbit/s with training traffic plus background flows and compared
flow-completion times against DCTCP and pFabric. No code was published, and
the paper's topology, buffers, thresholds, flow sizes and load are not
known; this is the same kind of experiment on ``commsched.sim.packet``, each
setting below chosen before any result was seen and printed with the results.

* **Fabric**: leaf-spine, ``--hosts-per-leaf`` hosts under each leaf (16), 4
  spines, leaf-spine links at ``hosts_per_leaf / 4`` times the host rate, so
  the core is not oversubscribed and congestion is where DLCP's argument
  puts it, at the receivers' edge ports; 2 µs per host link, 1 µs per fabric
  link; 9000-byte MTU; 1 MB of buffer per switch port; 5 strict-priority
  bands; RED/ECN at K = ``--k-bytes`` (90 kB, DCTCP's 65 packets at 10
  Gbit/s) for DCTCP and DLCP, pFabric's queues for pFabric.
* **Training traffic** (``--model``'s gradient, resnet18: 46.8 MB): a
  parameter server sharded over ``--servers`` colocated servers (default:
  every host, as BytePS places them): every worker pushes each server its
  slice and each server sends every worker the summed slice back, both at
  once (a pipelined PS, where one iteration's pushes meet the previous one's
  pulls): every server is the target of an incast.
* **Transports**: DCTCP (and ECMP), pFabric (ECMP), DLCP at the paper's 10 %
  bound, its datagrams sprayed over the spines, with the chunks below the
  10 % norm quantile unimportant (``dlcp.quantile`` = the bound: what the
  network may drop is what the receiver may give up); magnitudes i.i.d.;
  a receive STOPs as soon as 90 % arrived (``dlcp.stop_at_count``, the rule
  DLCP and MLT describe; ``--allowance``: the link's default, where the
  bound only covers what the network lost). Every other DLCP and TCP
  setting is the simulator's default.
* **Background**: web-search flows (DCTCP's distribution) at ``--load`` of
  every host link, Poisson arrivals between random hosts over ``[0,
  --duration-s)``, in the last band, on DCTCP (DCTCP's and DLCP's runs) or
  pFabric (pFabric's).
* **FCT part**: the training flows and the background flows of one round,
  each flow a connection of its own, started together; average and p99 FCT
  of each.
* **Iteration part**: ``--model`` trained on the same fabric and
  background, sharded PS (``ps`` over DCTCP and over pFabric; ``dlcp``
  ``mode=collective``: a shard on every rank, the same slices), 1 warm-up
  and ``--iterations`` measured iterations; the background covers the
  whole run (``--iterations`` + 2 iterations of a flow-level simulation
  of the ``ps`` run, times 2). Median and largest iteration time, and the FCT of the
  training messages of the measured iterations.

Everything is deterministic (seed 0). Compile the packet core and DLCP's
state machines first (``python -m commsched.sim.packet.compile``: the run
prints which core ran); ``--only`` and ``--skip-fct`` / ``--skip-iterations``
split the work, ``--json`` is rewritten after every row.

    python benchmarks/dlcp_simulation.py --hosts 16 --json dlcp-16.json     # one leaf, 100 Gbit/s
    python benchmarks/dlcp_simulation.py --hosts 144 --json dlcp-144.json   # the paper's scale: 9 leaves
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from commsched import zoo
from commsched.cluster import Cluster
from commsched.sim import simulate
from commsched.sim.packet import COMPILED, PacketConfig, RedParams, build
from commsched.sim.packet.background import background_flows
from commsched.sim.packet.config import DlcpParams
from commsched.sim.packet.run import simulate_packet
from commsched.sim.packet.scenario import Flow, FlowResult, run_flows

TRANSPORTS = ("dctcp", "pfabric", "dlcp")
TRAINING_CLASS = 1  # a layer class past the first (so that magnitudes decide DLCP's importance)


def cluster(hosts: int, gbps: float, servers: int) -> Cluster:
    nic = {"bandwidth_gbps": gbps, "latency_us": 2.0}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    spec: dict[str, Any] = {"name": f"{hosts}x{gbps:g}G", "nodes": nodes}
    if servers < hosts:
        spec["servers"] = {"count": servers, "colocated": True}
    return Cluster.from_dict(spec)


def configs(args: argparse.Namespace) -> dict[str, PacketConfig]:
    per_leaf = min(args.hosts_per_leaf, args.hosts)
    spines = 4
    base = PacketConfig(
        topology="leaf_spine",
        hosts_per_leaf=per_leaf,
        spines=spines,
        fabric_gbps=args.gbps * per_leaf / spines,
        fabric_latency_us=1.0,
        buffer_bytes=1_000_000,
        priority_classes=5,
        seed=0,
    )
    red = RedParams(min_bytes=args.k_bytes, max_bytes=args.k_bytes)
    dlcp = DlcpParams(quantile=args.loss_bound, stop_at_count=not args.allowance)
    return {
        "dctcp": replace(base, transport="dctcp", red=red),
        "pfabric": replace(base, transport="pfabric", pfabric=True),
        "dlcp": replace(base, transport="dctcp", red=red, dlcp=dlcp),
    }


def stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values) * 1e3
    if not arr.size:
        return {"flows": 0, "avg_ms": float("nan"), "p99_ms": float("nan")}
    return {"flows": int(arr.size), "avg_ms": float(arr.mean()), "p99_ms": float(np.percentile(arr, 99))}


def training_flows(name: str, args: argparse.Namespace) -> list[Flow]:
    gradient = zoo.load(args.model).total_bytes
    part = -(-gradient // args.servers)
    bound = args.loss_bound if name == "dlcp" else 0.0
    transport = "dlcp" if name == "dlcp" else ""
    out = []
    for s in range(args.servers):
        for w in range(args.hosts):
            if w != s:
                out.append(Flow(w, s, part, 0.0, TRAINING_CLASS, bound, transport))  # push
                out.append(Flow(s, w, part, 0.0, TRAINING_CLASS, bound, transport))  # pull
    return out


def dlcp_flow_stats(results: list[FlowResult]) -> dict[str, Any]:
    """What DLCP's state machines did over ``results``' flows: re-sends, PROBEs, rate control, losses."""
    senders = [r.sender for r in results]
    records = [rec for r in results for rec in r.receiver.records]
    numel = sum(rec[0] for rec in records)
    return {
        "resent": sum(s.retransmits for s in senders),
        "probes": sum(s.probes for s in senders),
        "rate_timeouts": sum(s.rate.timeouts for s in senders),
        "rate_decreases": sum(s.rate.decreases for s in senders),
        "at_bound": sum(rec[2] == "bound" for rec in records),
        "lost_fraction": sum(rec[1] for rec in records) / numel if numel else 0.0,
    }


def fct_run(name: str, config: PacketConfig, args: argparse.Namespace) -> dict[str, Any]:
    fabric = build(cluster(args.hosts, args.gbps, args.servers), config).fabric
    training = training_flows(name, args)
    back = background_flows(
        list(range(args.hosts)), args.load, args.gbps, "web_search", args.duration_s, 0, config.priority_classes - 1
    )
    start, cpu = time.perf_counter(), time.process_time()
    results = run_flows(fabric, training + back, config)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    train, other = results[: len(training)], results[len(training) :]
    return {
        "transport": name,
        "training": stats([r.fct_s for r in train]),
        "background": stats([r.fct_s for r in other]),
        "drops": sum(r.drops for r in results),
        "timeouts": sum(r.timeouts for r in results),  # TCP's RTOs (DLCP's own are in "dlcp")
        "dlcp": dlcp_flow_stats(train) if name == "dlcp" else None,
        "events": fabric.processed,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
    }


class Progress:
    """Every ``every_s`` of wall time, one line on stderr: simulated time against the background's window, events.

    The iteration part runs for minutes to an hour at 144 hosts; this says it is moving, terminal or not."""

    def __init__(self, label: str, window_s: float, every_s: float = 30.0) -> None:
        self.label, self.window_s, self.every_s = label, window_s, every_s
        self.fabric: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report, daemon=True)

    def watch(self, network: Any) -> None:
        self.fabric = network.fabric

    def __enter__(self) -> Progress:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _report(self) -> None:
        while not self._stop.wait(self.every_s):
            fabric = self.fabric
            if fabric is None:
                continue
            wall = time.perf_counter() - self._start
            events = fabric.processed
            print(f"  {self.label}: {fabric.now * 1e3:.1f} of at most {self.window_s * 1e3:.0f} simulated ms, "
                  f"{events / 1e6:.1f} M events, {wall:.0f} s ({events / wall / 1e6:.2f} M/s)",
                  file=sys.stderr, flush=True)  # fmt: skip


def iteration_run(name: str, config: PacketConfig, args: argparse.Namespace, duration_s: float) -> dict[str, Any]:
    hosts = cluster(args.hosts, args.gbps, args.servers)
    workload = zoo.load(args.model)
    config = replace(config, background_load=args.load, background_duration_s=duration_s)
    start, cpu = time.perf_counter(), time.process_time()
    with Progress(f"iter {name}", duration_s, args.progress_s) as progress:
        if name == "dlcp":
            mode = "collective" if args.servers == args.hosts else "ps"
            run = simulate_packet(workload, hosts, "dlcp", config, args.iterations, 1, trace=False, mode=mode,
                                  loss_bound=args.loss_bound, on_network=progress.watch)  # fmt: skip
        else:
            run = simulate_packet(workload, hosts, "ps", config, args.iterations, 1, trace=False,
                                  on_network=progress.watch)  # fmt: skip
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    net = run.network
    rows = net.flow_stats()  # the training job's connections
    measured = [fct for launch, _, fct in net.message_fcts if launch >= 1]  # after the warm-up iteration
    return {
        "transport": name,
        "iteration_ms": run.result.iteration_ms,
        "iteration_max_ms": max(run.result.iteration_ms_each),
        "compute_ms": run.result.compute_ms,
        "training_messages": stats(measured),
        "background": stats([fct for _, fct in net.background_fcts]),
        "dlcp": net.dlcp_stats() if name == "dlcp" else None,
        **{key: sum(row[key] for row in rows) for key in ("drops", "marks", "timeouts")},
        "events": net.fabric.processed,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
    }


def background_window_s(args: argparse.Namespace) -> float:
    """How long the iteration runs last, from the flow-level model's ``ps`` prediction, times 2 (a margin)."""
    hosts = cluster(args.hosts, args.gbps, args.servers)
    flow = simulate(zoo.load(args.model), hosts, "ps", args.iterations, 1, trace=False)
    return 2 * (args.iterations + 2) * flow.iteration_ms / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--hosts-per-leaf", type=int, default=16)
    parser.add_argument("--gbps", type=float, default=100.0)
    parser.add_argument("--servers", type=int, default=0, help="colocated parameter servers (0: every host)")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--load", type=float, default=0.3, help="background load per host link")
    parser.add_argument("--duration-s", type=float, default=0.01, help="FCT part: background arrivals over this")
    parser.add_argument("--loss-bound", type=float, default=0.1, help="DLCP's bound (the paper's evaluation: 10 %%)")
    parser.add_argument("--k-bytes", type=int, default=90_000, help="RED/ECN threshold K")
    parser.add_argument("--allowance", action="store_true", help="DLCP stops by the link's default rule")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--skip-fct", action="store_true")
    parser.add_argument("--skip-iterations", action="store_true")
    parser.add_argument("--only", choices=TRANSPORTS, action="append", help="run only these transports")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--progress-s", type=float, default=30.0, help="iteration part: a progress line this often")
    args = parser.parse_args()
    args.servers = args.servers or args.hosts
    if args.servers not in (1, args.hosts) and not args.skip_iterations:
        parser.error("--servers: the iteration part compares like with like only for 1 server or every host")
    names = args.only or list(TRANSPORTS)
    out: dict[str, Any] = {"settings": vars(args), "compiled": COMPILED, "fct": [], "iteration": []}
    print(f"core: {'compiled (mypyc)' if COMPILED else 'pure Python'}", flush=True)

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    all_configs = configs(args)
    if not args.skip_fct:
        for name in names:
            row = fct_run(name, all_configs[name], args)
            out["fct"].append(row)
            save()
            t, b = row["training"], row["background"]
            print(f"FCT  {name:8s} training avg {t['avg_ms']:.3f} ms p99 {t['p99_ms']:.3f} ms | background avg "
                  f"{b['avg_ms']:.3f} ms p99 {b['p99_ms']:.3f} ms | drops {row['drops']} timeouts {row['timeouts']} | "
                  f"{row['events']} events, {row['wall_s']:.1f} s ({row['cpu_s']:.1f} s CPU)", flush=True)  # fmt: skip
    if not args.skip_iterations:
        window_s = background_window_s(args)
        out["background_window_s"] = window_s
        for name in names:
            row = iteration_run(name, all_configs[name], args, window_s)
            out["iteration"].append(row)
            save()
            m = row["training_messages"]
            print(f"iter {name:8s} median {row['iteration_ms']:.2f} ms, max {row['iteration_max_ms']:.2f} ms "
                  f"(compute {row['compute_ms']:.2f}) | messages avg {m['avg_ms']:.3f} p99 {m['p99_ms']:.3f} ms | "
                  f"drops {row['drops']} marks {row['marks']} timeouts {row['timeouts']} | "
                  f"{row['events']} events, {row['wall_s']:.1f} s ({row['cpu_s']:.1f} s CPU)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
