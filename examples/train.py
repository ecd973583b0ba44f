"""Train a small model data-parallel on synthetic data under a commsched policy.

    torchrun --nproc-per-node 4 examples/train.py --policy dear --model cnn --iters 20

Models come from ``commsched.models`` (``cnn``, ``transformer``, ``resnet5m``).
Prints, on rank 0, the median iteration time and throughput after warm-up, and
(with --check) the largest parameter difference from a PyTorch DDP run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

import commsched
from commsched.bench.config import AUTO_WARMUP
from commsched.cli.inputs import KNOB_HELP, knobs_by_policy, parse_knob
from commsched.errors import ScheduleError
from commsched.models import MODELS, build_model, model_loss, synthetic_batch
from commsched.runtime import RUNTIME_POLICIES


def run(
    policy: str, model_name: str, iters: int, batch: int, options: dict, trace: bool = False
) -> tuple[list[float], nn.Module]:
    rank = dist.get_rank()
    model = build_model(model_name, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if trace and policy != "torch_ddp":
        options = {**options, "trace": True}
    model, optimizer = commsched.parallelize(model, optimizer, policy=policy, **options)
    times = []
    for step in range(iters):
        x, y = synthetic_batch(model_name, batch, seed=0, rank=rank, step=step)
        start = time.perf_counter()
        loss = model_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    if hasattr(model, "flush"):
        model.flush()
    return times, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="dear", choices=RUNTIME_POLICIES)
    parser.add_argument("--model", default="cnn", choices=sorted(MODELS))
    parser.add_argument("--iters", type=int, help="iterations in all (default: the warm-up and 15 more)")
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"iterations left out of the timing (default 5; for auto {AUTO_WARMUP}: its trials end by then)",
    )
    parser.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    parser.add_argument("--check", action="store_true", help="also train with torch_ddp and compare parameters")
    parser.add_argument("--json", help="write rank 0's result here")
    parser.add_argument("--trace", help="write rank 0's measured trace here (commsched Trace JSON)")
    parser.add_argument("-k", "--knob", action="append", default=[], metavar="POLICY.KNOB=VALUE", help=KNOB_HELP)
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = AUTO_WARMUP if args.policy == "auto" else 5
    if args.iters is None:
        args.iters = args.warmup + 15
    if args.iters <= args.warmup:
        parser.error(f"--iters ({args.iters}) must be larger than --warmup ({args.warmup})")
    try:  # checked now, before any process group exists
        options = knobs_by_policy([parse_knob(text) for text in args.knob], [args.policy]).get(args.policy, {})
    except ScheduleError as exc:
        parser.error(str(exc))
    dist.init_process_group("gloo")
    times, model = run(args.policy, args.model, args.iters, args.batch, options, trace=bool(args.trace))
    iter_s = statistics.median(times[args.warmup :])
    plan = getattr(model, "plan", None)
    result = {
        "plan": plan.policy if plan is not None else args.policy,
        "plan_knobs": plan.knobs.to_dict() if plan is not None else {},
        "policy": args.policy,
        "model": args.model,
        "world_size": dist.get_world_size(),
        "iteration_ms": iter_s * 1e3,
        "samples_per_s": args.batch * dist.get_world_size() / iter_s,
    }
    if args.check and args.policy != "torch_ddp":
        _, ref = run("torch_ddp", args.model, args.iters, args.batch, {})
        mine = dict(getattr(model, "module", model).named_parameters())
        result["max_param_diff_vs_torch_ddp"] = max(
            (p - mine[n]).abs().max().item() for n, p in ref.module.named_parameters()
        )
    if args.trace and dist.get_rank() == 0 and getattr(model, "trace", None) is not None:
        model.trace.save(args.trace)
    if hasattr(model, "close"):
        model.close()
    if dist.get_rank() == 0:
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
