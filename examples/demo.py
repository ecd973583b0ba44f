"""The main job: predict with the simulator, then measure for real on this machine.

1. Ask the planner (``commsched advise``): every policy, its knobs searched,
   simulated on a zoo model and cluster preset (``--model``/``--cluster``,
   default ResNet-50 on 64 V100s, 10 GbE); print the ranking.
2. Train a small CNN data-parallel with local processes (gloo on CPU, one per
   core: 2 by default) under ``policy="auto"`` (which measures this machine,
   runs the same search on what it measured, and trains with the winner) and
   under PyTorch DDP, on the same synthetic data, and print both: iteration
   time, throughput, what auto chose and the largest parameter difference.

    python examples/demo.py [--model resnet50] [--cluster 64xV100-10GbE] [--workers 2] [--iters 20]
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
from commsched.bench.config import AUTO_WARMUP
from commsched.cluster import load_cluster
from commsched.plan import advise

HERE = Path(__file__).resolve().parent


def show_advice(model: str, cluster: str, console: Console) -> None:
    workload, spec = zoo.load(model), load_cluster(cluster)
    with console.status(f"searching every policy's knobs on {model} / {cluster}"):
        advice = advise(workload, spec)
    table = Table(title=f"simulated {model} on {cluster}: policies ranked (knobs searched)")
    for col in ("policy", "iteration ms", "vs ddp", "knobs"):
        table.add_column(col, justify="left" if col in ("policy", "knobs") else "right")
    ddp = next(c.iteration_ms for c in advice.candidates if c.policy == "ddp")
    for c in advice.candidates:
        knobs = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.knobs.items())
        table.add_row(c.policy, f"{c.iteration_ms:.1f}", f"{ddp / c.iteration_ms:.2f}x", knobs or "-")
    console.print(table)
    console.print(
        f"lower bound for any lossless schedule: {advice.ideal.iteration_ms:.1f} ms; {advice.parallelize_call()}"
    )


def train(policy: str, workers: int, iters: int, out: Path) -> dict:
    """``iters`` timed iterations after ``auto``'s trials (both policies alike: the same warm-up)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers),
        str(HERE / "train.py"), "--policy", policy, "--model", "cnn", "--iters", str(AUTO_WARMUP + iters),
        "--warmup", str(AUTO_WARMUP), "--json", str(out),
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
    parser.add_argument("--workers", type=int, default=2, help="local processes (one per core measures best)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations, after auto's trials")
    args = parser.parse_args()
    console = Console()
    show_advice(args.model, args.cluster, console)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("torch_ddp", "auto"):
            with console.status(f"training a small CNN with {args.workers} processes under {name}"):
                rows.append(train(name, args.workers, args.iters, Path(tmp) / f"{name}.json"))
    table = Table(title=f"real training on this machine: {args.workers} gloo processes, small CNN, synthetic data")
    for col in ("policy", "iteration ms", "samples/s", "vs torch_ddp", "max |Δparam| vs torch_ddp", "ran"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    base = rows[0]["iteration_ms"]
    for r in rows:
        diff = r.get("max_param_diff_vs_torch_ddp")
        table.add_row(
            r["policy"], f"{r['iteration_ms']:.1f}", f"{r['samples_per_s']:.1f}", f"{base / r['iteration_ms']:.2f}x",
            "—" if diff is None else f"{diff:.1e}", r.get("plan", "—"),
        )  # fmt: skip
    console.print(table)
    console.print(
        "Loopback between local processes is fast, so this run shows correctness and overhead; "
        "slow-network measurements come from `commsched bench` (see BENCHMARKS.md)."
    )


if __name__ == "__main__":
    main()
