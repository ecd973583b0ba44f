"""PyTorch DDP's buckets with and without ``find_unused_parameters``, and what they cost on a slow link.

    sudo .venv/bin/python benchmarks/ddp_buckets.py [--model resnet5m] [--workers 2] [--bandwidth 300mbit]

``commsched.parallelize(policy="torch_ddp")`` (the baseline of ``commsched
bench``) builds ``DistributedDataParallel(model, find_unused_parameters=True)``.
With that flag DDP keeps its initial buckets (registration order, the first
layers in a 1 MiB bucket, the rest in 25 MiB ones); without it, it rebuilds
them after the first iteration in gradient-ready order. This script trains the
same model both ways, side by side, on the emulated testbed (one network
namespace per worker, tc-shaped links; needs root), and prints each
configuration's bucket sizes (``DistributedDataParallel._get_ddp_logging_data``)
and its median iteration time over the timed steps of each repeat. The
simulator's ``ddp`` policy models the rebuilt buckets by default and the
initial ones with ``rebuilt=False``.

``commsched bench`` itself measures both flags at bucket caps 1, 4 and 25 MiB
in every session (its default DDP and best DDP rows,
:mod:`commsched.bench.baselines`); this script adds DDP's own bucket sizes.
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

WORKER = "worker"


def worker(out: Path, model_name: str, steps: int, warmup: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from commsched.models import build_model, model_loss, synthetic_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, dict[str, Any]] = {}
    for _ in range(repeats):
        for unused in (False, True):  # alternate, so drifts of the machine hit both alike
            model = DistributedDataParallel(build_model(model_name, 0), find_unused_parameters=unused)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            times = []
            dist.barrier()
            for step in range(warmup + steps):
                x, y = synthetic_batch(model_name, 8, 0, rank, step)
                start = time.perf_counter()
                model_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                times.append(time.perf_counter() - start)
            data = model._get_ddp_logging_data()
            key = f"find_unused_parameters={unused}"
            entry = result.setdefault(key, {"iteration_ms": []})
            entry["buckets"] = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
            entry["rebuilt"] = bool(data.get("has_rebuilt_buckets"))
            entry["iteration_ms"].append(statistics.fmean(times[warmup:]) * 1e3)
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet5m")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bandwidth", default="300mbit", help="per-worker link rate, tc syntax; 'none' = unshaped")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from commsched.testbed import LinkShape, NetnsTestbed, netns_unavailable_reason, parse_rate
    from commsched.testbed.launch import run_workers

    reason = netns_unavailable_reason()
    if reason is not None:
        sys.exit(f"ddp_buckets: needs the namespace testbed: {reason}")
    with tempfile.TemporaryDirectory() as tmp, NetnsTestbed(args.workers, log=print) as bed:
        bed.set_shape(LinkShape(rate_bps=parse_rate(args.bandwidth)))
        argv = [sys.executable, __file__, WORKER, tmp, args.model, str(args.steps), str(args.warmup), str(args.repeats)]
        run_workers(bed, argv, log_dir=Path(tmp) / "logs", timeout_s=900, extra_env={"OMP_NUM_THREADS": "1"})
        result = json.loads((Path(tmp) / "result.json").read_text())
    print(f"{args.model}, {args.workers} workers, links {args.bandwidth}, mean of {args.steps} steps per repeat")
    print(f"{'DDP':32} {'bucket bytes, bucket 0 (reduced first) on':42} {'median iteration ms (repeats)'}")
    for key, entry in result.items():
        times = entry["iteration_ms"]
        spread = ", ".join(f"{t:.0f}" for t in times)
        print(f"{key:32} {entry['buckets']:42} {statistics.median(times):.0f} ({spread})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == WORKER:
        worker(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        main()
