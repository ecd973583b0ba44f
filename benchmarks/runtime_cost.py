"""Where an iteration's time goes: PyTorch DDP against the runtime, per thread, on two gloo ranks with a core each.

    python benchmarks/runtime_cost.py --configs torch,ddp --blocks 3 --json runtime-cost.json

Each rank is pinned to its own core (``os.sched_setaffinity``; one intra-op
thread) and both talk over loopback. The configurations take turns in blocks
(a fresh model and wrapper per block, the same data), so the host's drift
falls on all of them alike. Per timed iteration (after ``--warmup``): wall
time, the process's CPU time (every thread), the training thread's CPU time,
and forward / backward / step; per block, the CPU each thread of the process
used (``/proc/self/task/*/stat``; ``--cpu user`` or ``system`` counts one part) and how often it blocked (voluntary
context switches, ``status``: each a wake-up to come), summed by thread name: the interpreter's
name is the training thread, ``cs-*`` the runtime's own threads,
``gloo_tcp_loop`` gloo's socket loops, ``pt_gloo_runloop`` its work
threads; :mod:`commsched.bench.threads`), per iteration. Medians
over iterations (times) and over blocks (threads) are printed for rank 0.

Configurations: ``torch`` (``DistributedDataParallel(model)``, the defaults),
``torch_view`` (the same with ``gradient_as_bucket_view=True``), or a
commsched policy with optional knobs as JSON, ``ddp`` or
``'ddp:{"bucket_cap_mb": 4}'``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from commsched.bench.threads import per_iteration, per_iteration_ms, thread_cpu_s, thread_sleeps

PHASES = ("wall", "cpu", "thread", "forward", "backward", "step")


def _wrap(name: str, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[Any, torch.optim.Optimizer]:
    if name == "torch":
        return DistributedDataParallel(model), opt
    if name == "torch_view":
        return DistributedDataParallel(model, gradient_as_bucket_view=True), opt
    from commsched.runtime import parallelize

    policy, _, knobs = name.partition(":")
    return parallelize(model, opt, policy=policy, **(json.loads(knobs) if knobs else {}))


def _rank(rank: int, args: argparse.Namespace, out: Path) -> None:
    from commsched.models import build_model, model_loss, synthetic_batch

    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    data = [synthetic_batch(args.model, args.batch, 0, rank, step) for step in range(4)]
    configs = args.configs.split(",")
    result: dict[str, Any] = {
        c: {"times_s": {p: [] for p in PHASES}, "threads_ms": [], "threads_sleeps": []} for c in configs
    }
    for block in range(args.blocks):
        for name in configs:
            model = build_model(args.model, 0)
            wrapped, opt = _wrap(name, model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
            times = result[name]["times_s"]
            before, slept = thread_cpu_s(args.cpu), thread_sleeps()
            for it in range(args.warmup + args.iters):
                x, y = data[it % len(data)]
                t0, c0, th0 = time.perf_counter(), time.process_time(), time.thread_time()
                loss = model_loss(wrapped(x), y)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                opt.step()
                opt.zero_grad()
                t3 = time.perf_counter()
                if it == args.warmup - 1:
                    before, slept = thread_cpu_s(args.cpu), thread_sleeps()
                if it >= args.warmup:
                    for phase, seconds in zip(
                        PHASES,
                        (t3 - t0, time.process_time() - c0, time.thread_time() - th0, t1 - t0, t2 - t1, t3 - t2),
                        strict=True,
                    ):
                        times[phase].append(seconds)
            result[name]["threads_ms"].append(per_iteration_ms(before, thread_cpu_s(args.cpu), args.iters))
            result[name]["threads_sleeps"].append(per_iteration(slept, thread_sleeps(), args.iters))
            close = getattr(wrapped, "close", None)
            if close is not None:
                close()
            if rank == 0:
                print(f"block {block + 1}/{args.blocks}: {name} done", flush=True)
    if rank == 0:
        out.write_text(
            json.dumps(
                {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "results": result}
            )
        )
    dist.destroy_process_group()


def summary(report: dict[str, Any]) -> str:
    """Rank 0's medians as a Markdown table, with the CPU per thread name and, where the run counted them, the
    sleeps per thread name (medians over blocks)."""
    counted = all(r.get("threads_sleeps") for r in report["results"].values())
    lines = ["| configuration | " + " | ".join(f"{p} ms" for p in PHASES) + " | CPU per thread, ms per iteration |"]
    lines[0] += " sleeps per thread per iteration |" if counted else ""
    lines.append("|---" * (len(PHASES) + 2 + counted) + "|")
    for name, r in report["results"].items():
        cells = [f"{1e3 * statistics.median(r['times_s'][p]):.1f}" for p in PHASES]
        threads = _per_name(r["threads_ms"])
        sleeps = f" {_per_name(r['threads_sleeps'])} |" if counted else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {threads} |" + sleeps)
    return "\n".join(lines)


def _per_name(blocks: list[dict[str, float]]) -> str:
    """Each thread name's median over ``blocks``, largest first, as ``name value``."""
    names = sorted({n for block in blocks for n in block})
    median = {n: statistics.median(block.get(n, 0.0) for block in blocks) for n in names}
    return ", ".join(f"{n} {v:.1f}" for n, v in sorted(median.items(), key=lambda kv: -kv[1]) if v > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="torch,ddp", help="comma-separated configurations (default: %(default)s)")
    parser.add_argument("--model", default="resnet5m", help="a model of commsched.models (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per block (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=6, help="untimed iterations per block (default: %(default)s)")
    parser.add_argument("--blocks", type=int, default=3, help="blocks of every configuration (default: %(default)s)")
    parser.add_argument("--port", type=int, default=29555, help="rendezvous port on 127.0.0.1 (default: %(default)s)")
    parser.add_argument(
        "--cpu",
        choices=("both", "user", "system"),
        default="both",
        help="each thread's CPU counted: user + system, or one of them (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="write every timing here")
    args = parser.parse_args()
    from commsched.models import MODELS

    if args.model not in MODELS:
        parser.error(f"--model: {args.model!r} is not one of {sorted(MODELS)}")
    for flag in ("batch", "iters", "warmup", "blocks"):
        if getattr(args, flag) < (0 if flag == "warmup" else 1):
            parser.error(f"--{flag}: must be >= {0 if flag == 'warmup' else 1}, got {getattr(args, flag)}")
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("needs two cores, one per rank (two ranks on one core measure contention, not cost)")
    with tempfile.TemporaryDirectory() as tmp:
        out = (args.json or Path(tmp) / "runtime-cost.json").resolve()
        mp.spawn(_rank, args=(args, out), nprocs=2)
        print(summary(json.loads(out.read_text())))
    if args.json is not None:
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
