"""How fast the simulator is, and how its cost grows with workers, tensors and iterations.

Run from the repository root::

    python benchmarks/sim_speed.py            # about a minute on 2 cores
    python benchmarks/sim_speed.py --quick    # fewer repeats

Every figure is the median wall time over ``--repeats`` runs of
``commsched.sim.simulate`` (plan building included, Trace recorded unless a
row says otherwise). A policy that fails (a scheduler bug the simulator
reports) is listed as failed and left out of the totals.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from rich.console import Console
from rich.table import Table

from commsched import zoo
from commsched.cluster import Cluster, load_cluster
from commsched.errors import CommschedError
from commsched.schedule import POLICIES
from commsched.sim import SimResult, simulate
from commsched.workload import Workload

POLICY_ORDER = ("no_overlap", "ddp", "wfbp", "horovod", "bytescheduler", "prophet", "dear")


def uniform_cluster(workers: int, per_node: int = 8, speeds: tuple[float, ...] = (1.0,)) -> Cluster:
    """``workers`` V100s, ``per_node`` per node, 100 Gbit/s NICs; node ``i`` gets ``speeds[i % len(speeds)]``."""
    nodes = []
    for i in range(max(1, workers // per_node)):
        count = min(per_node, workers)
        nodes.append(
            {
                "name": f"n{i}",
                "count": count,
                "device": {"name": "V100", "speed": speeds[i % len(speeds)], "memory_gib": 16},
                "nic": {"bandwidth_gbps": 100, "latency_us": 2, "per_message_overhead_us": 4},
                "intra": {"bandwidth_gbps": 150, "latency_us": 1, "per_message_overhead_us": 2},
            }
        )
    return Cluster.from_dict({"name": f"{workers}xV100-100G", "nodes": nodes})


def timed(repeats: int, run: Callable[[], SimResult]) -> tuple[float, SimResult]:
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def policy_sweep(
    console: Console, title: str, workload: Workload, cluster: Cluster, repeats: int, iterations: int = 20
) -> float:
    table = Table(title=title)
    for name in ("policy", "wall s", "events", "events/s", "iteration ms"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    total_s, total_events = 0.0, 0
    failures = []
    for policy in [p for p in POLICY_ORDER if p in POLICIES]:
        try:
            wall, result = timed(repeats, partial(simulate, workload, cluster, policy, iterations, 3))
        except CommschedError as exc:
            table.add_row(policy, "failed", "", "", "")
            failures.append(str(exc))
            continue
        total_s += wall
        total_events += result.events
        table.add_row(
            policy, f"{wall:.3f}", f"{result.events:,}", f"{result.events / wall:,.0f}", f"{result.iteration_ms:.1f}"
        )
    table.add_row(
        "[bold]all[/bold]", f"[bold]{total_s:.3f}[/bold]", f"{total_events:,}", f"{total_events / total_s:,.0f}", ""
    )
    console.print(table)
    for failure in failures:
        console.print(f"[red]failed:[/red] {failure}", soft_wrap=True)
    return total_s


def scaling(
    console: Console, title: str, column: str, rows: list[tuple[str, Callable[[], SimResult]]], repeats: int
) -> None:
    table = Table(title=title)
    for name in (column, "wall s", "events", "events/s", "worker classes"):
        table.add_column(name, justify="right")
    for label, run in rows:
        wall, result = timed(repeats, run)
        table.add_row(
            label, f"{wall:.3f}", f"{result.events:,}", f"{result.events / wall:,.0f}", str(len(result.classes))
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 repeats, smaller sweeps")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    console = Console()
    console.print(f"python {platform.python_version()} on {platform.machine()}, median of {repeats} runs")

    resnet50, bert_large = zoo.load("resnet50"), zoo.load("bert_large")
    total = policy_sweep(
        console,
        "7 policies x resnet50 x 64xV100-10GbE x 20 iterations",
        resnet50,
        load_cluster("64xV100-10GbE"),
        repeats,
    )
    console.print(f"-> {total:.2f} s for all policies (target < 2 s)")
    big = uniform_cluster(1024)
    title = "7 policies x bert_large x 1024 workers (128 x 8 V100, 100 Gbit/s) x 20 iterations"
    total = policy_sweep(console, title, bert_large, big, repeats)
    console.print(f"-> {total:.2f} s for all policies (target < 10 s)")

    policy = "dear"
    kwargs: dict[str, Any] = {"iterations": 20, "warmup": 3}
    sizes = {n: uniform_cluster(n) for n in (8, 64, 1024, 8192)}
    scaling(
        console,
        f"workers ({policy}, resnet50, 20 iterations): identical workers share one timeline",
        "workers",
        [(str(n), partial(simulate, resnet50, c, policy, **kwargs)) for n, c in sizes.items()],
        repeats,
    )
    mixes = {k: uniform_cluster(64, speeds=tuple(1 - 0.1 * i for i in range(k))) for k in (1, 2, 4, 8)}
    scaling(
        console,
        f"worker classes ({policy}, resnet50, 64 workers, node speeds 1, 0.9, 0.8, ...)",
        "distinct speeds",
        [(str(k), partial(simulate, resnet50, c, policy, **kwargs)) for k, c in mixes.items()],
        repeats,
    )
    models = ("resnet18", "resnet50", "resnet152", "densenet201") if not args.quick else ("resnet18", "resnet152")
    scaling(
        console,
        "tensors (wfbp: one all-reduce per tensor, 64 workers, 20 iterations)",
        "model (tensors)",
        [
            (f"{m} ({len(w.tensors)})", partial(simulate, w, sizes[64], "wfbp", **kwargs))
            for m, w in ((m, zoo.load(m)) for m in models)
        ],
        repeats,
    )  # fmt: skip
    scaling(
        console,
        f"iterations ({policy}, resnet50, 64 workers)",
        "iterations",
        [(str(n), partial(simulate, resnet50, sizes[64], policy, n, 3)) for n in (5, 20, 80, 320)],
        repeats,
    )
    scaling(
        console,
        f"trace recording ({policy}, bert_large, 1024 workers, 20 iterations)",
        "trace",
        [(str(flag), partial(simulate, bert_large, sizes[1024], policy, 20, 3, trace=flag)) for flag in (True, False)],
        repeats,
    )


if __name__ == "__main__":
    main()
