"""How much cyclic garbage each policy leaves per training iteration: objects only the collector frees.

    python benchmarks/cyclic_garbage.py [--policies ddp,ps,dlcp] [--model cnn] [--iters 50]

Two gloo ranks on loopback train ``--model`` under each policy in turn: ``--warmup`` iterations (the runtime's
own warm-up included), then ``--iters`` with the collector off, then one full pass that keeps what it finds
(``gc.DEBUG_SAVEALL``). Rank 0 prints, per policy, the objects found per iteration and the most common types.
What reference counting frees never reaches the collector; what sits in a reference cycle waits for its next
pass, and a pass stops every Python thread of the process (a DLCP link's I/O thread, the ``ps`` transport's
receiving threads): the fewer such objects, the rarer and shorter the passes.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commsched._sockets import free_port


def garbage_of(policy: str, args: argparse.Namespace) -> tuple[int, Counter[str]]:
    """Cyclic garbage of ``args.iters`` iterations of ``policy`` on this rank: the count and the count by type."""
    from commsched.models import build_model, model_loss, synthetic_batch
    from commsched.runtime import parallelize

    model = build_model(args.model, 0)
    wrapped, opt = parallelize(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), policy=policy)
    x, y = synthetic_batch(args.model, 8, 0, dist.get_rank(), 0)

    def step() -> None:
        opt.zero_grad()
        model_loss(wrapped(x), y).backward()
        opt.step()

    try:
        for _ in range(args.warmup):
            step()
        gc.collect()
        gc.disable()
        try:
            for _ in range(args.iters):
                step()
            gc.set_debug(gc.DEBUG_SAVEALL)
            found = gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    finally:
        close: Any = getattr(wrapped, "close", None)
        if close is not None:
            close()
    return found, kinds


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for policy in args.policies:
            found, kinds = garbage_of(policy, args)
            if rank == 0:
                top = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(6))
                print(f"{policy}: {found / args.iters:.1f} objects of cyclic garbage per iteration"
                      + (f" (in all: {top})" if top else ""), flush=True)  # fmt: skip
    finally:
        dist.destroy_process_group()


def main() -> None:
    from commsched.models import MODELS
    from commsched.schedule import RUNTIME_POLICIES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="ddp,ps,dlcp", help="comma-separated (default ddp,ps,dlcp)")
    parser.add_argument("--model", default="cnn", help=f"one of {', '.join(MODELS)} (default cnn)")
    parser.add_argument("--warmup", type=int, default=30, help="iterations before counting (default 30)")
    parser.add_argument("--iters", type=int, default=50, help="iterations counted (default 50)")
    args = parser.parse_args()
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in args.policies if p not in RUNTIME_POLICIES]
    if unknown or not args.policies:
        parser.error(f"--policies: unknown policy {unknown or args.policies}; known: {', '.join(RUNTIME_POLICIES)}")
    if args.model not in MODELS:
        parser.error(f"--model: unknown model {args.model!r}; known: {', '.join(MODELS)}")
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"--iters must be at least 1 and --warmup at least 0, got {args.iters} and {args.warmup}")
    mp.spawn(_rank, args=(args, free_port()), nprocs=2)


if __name__ == "__main__":
    main()
