"""The main job: predict with the simulator, then measure for real on this machine.

1. Simulate every policy on a zoo model and cluster preset and pick the fastest
   commsched policy (``--model``/``--cluster``, default ResNet-50 on 64 V100s, 10 GbE).
2. Train a small CNN data-parallel with 4 local processes (gloo on CPU) under
   that policy and under PyTorch DDP, on the same synthetic data, and print both:
   iteration time, throughput and the largest parameter difference.

    python examples/demo.py [--model resnet50] [--cluster 64xV100-10GbE] [--workers 4] [--iters 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.schedule import POLICIES
from commsched.sim import simulate

HERE = Path(__file__).resolve().parent


def best_policy(model: str, cluster: str, console: Console) -> str:
    workload, spec = zoo.load(model), load_cluster(cluster)
    results = {}
    with console.status(f"simulating {len(POLICIES)} policies on {model} / {cluster}"):
        for policy in POLICIES:
            results[policy] = simulate(workload, spec, policy, trace=False).iteration_ms
    best = min((p for p in results if p != "no_overlap"), key=results.__getitem__)
    console.print(
        f"simulated {model} on {cluster}: best commsched policy [bold]{best}[/] "
        f"({results[best]:.1f} ms/iteration, ddp {results['ddp']:.1f} ms)"
    )
    return best


def train(policy: str, workers: int, iters: int, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers),
        str(HERE / "train.py"), "--policy", policy, "--model", "cnn", "--iters", str(iters),
        "--warmup", "5", "--json", str(out),
    ]  # fmt: skip
    if policy != "torch_ddp":
        cmd.append("--check")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"training with {policy} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--cluster", default="64xV100-10GbE")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    console = Console()
    policy = best_policy(args.model, args.cluster, console)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("torch_ddp", policy):
            with console.status(f"training a small CNN with {args.workers} processes under {name}"):
                rows.append(train(name, args.workers, args.iters, Path(tmp) / f"{name}.json"))
    table = Table(title=f"real training on this machine: {args.workers} gloo processes, small CNN, synthetic data")
    for col in ("policy", "iteration ms", "samples/s", "vs torch_ddp", "max |Δparam| vs torch_ddp"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    base = rows[0]["iteration_ms"]
    for r in rows:
        diff = r.get("max_param_diff_vs_torch_ddp")
        table.add_row(
            r["policy"], f"{r['iteration_ms']:.1f}", f"{r['samples_per_s']:.1f}", f"{base / r['iteration_ms']:.2f}x",
            "—" if diff is None else f"{diff:.1e}",
        )  # fmt: skip
    console.print(table)
    console.print(
        "Loopback between local processes is fast, so this run shows correctness and overhead; "
        "slow-network measurements come from `commsched bench` (see BENCHMARKS.md)."
    )


if __name__ == "__main__":
    main()
