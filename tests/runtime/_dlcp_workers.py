"""Functions run inside spawned gloo ranks by the runtime's DLCP tests. Results go back through files.

The model is an MLP whose larger tensors span hundreds of datagrams, so a
bound of a few percent can give up whole packets.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import _dlcp_fuzz as F
import torch
import torch.distributed as dist
from torch import nn

from commsched.runtime.api import parallelize
from commsched.transport import TransportOptions

from _workers import init

KEY = F.KEY
STEPS = 12
SMALL = {"partition_mb": 0.125, "credit_mb": 0.5}  # the 256x256 weight in two partitions


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def flat(model: nn.Module) -> torch.Tensor:
    inner = getattr(model, "module", model)
    return torch.cat([p.detach().reshape(-1) for p in inner.parameters()])


def train(
    policy: str,
    rank: int,
    steps: int,
    *,
    optimizer: str = "adamw",
    after_step: Any = None,
    **kw: Any,
) -> tuple[nn.Module, list[float]]:
    model = mlp()
    opt: torch.optim.Optimizer = (
        torch.optim.AdamW(model.parameters(), lr=0.01)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    )
    wrapped, opt = parallelize(model, opt, policy=policy, **kw)
    losses = []
    for step in range(steps):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(wrapped(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if after_step is not None:
            after_step(wrapped, step)
        opt.zero_grad()
    if hasattr(wrapped, "flush"):
        wrapped.flush()
    return wrapped, losses


def records(wrapped: Any) -> list[dict[str, Any]]:
    out = []
    for rec in wrapped.loss_records():
        for t in rec.transfers:
            out.append({"iteration": rec.iteration, "task": t.task, "phase": t.phase, "lost": t.lost_numel,
                        "received": t.received_numel, "bound": t.loss_bound, "by_tensor": sum(t.lost_by_tensor),
                        "injected": rec.drops.injected, "socket": rec.drops.socket, "late": rec.drops.late,
                        "rcvbuf": rec.drops.rcvbuf, "send_errors": rec.drops.send_errors})  # fmt: skip
    return out


def everything(rank: int, world: int, port: int, out: str, every: int, steps: int, examples: int) -> None:
    """Every part below in one pair of processes (start-up is the dearest part); each part's result or error."""
    init(rank, world, port)
    results: dict[str, Any] = {}
    for name, part in (("bounds", bounds), ("replicas", replicas), ("fuzz", fuzz)):
        results[name] = {}
        start = time.perf_counter()
        try:
            part(rank, world, results[name], every=every, steps=steps, examples=examples)
        except Exception:
            results[name]["error"] = traceback.format_exc()
        results[name]["seconds"] = time.perf_counter() - start
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def bounds(rank: int, world: int, results: dict[str, Any], **_: Any) -> None:
    """Injected loss far above the bounds, both modes; zero loss at a bound > 0 against torch_ddp."""
    for mode in ("collective", "ps"):
        opts = TransportOptions(inject_loss=0.15, inject_seed=5)
        # 351 float32 per datagram: 5 % of a 16384-element push shard is two whole datagrams, 3 % of a pull one
        wrapped, losses = train("dlcp", rank, 8, mode=mode, loss_bound=0.05, pull_loss_bound=0.03,
                                transport_options=opts, replica_check_every=0, **SMALL)  # fmt: skip
        results[f"lossy/{mode}"] = {"records": records(wrapped), "losses": losses,
                                    "finite": bool(torch.isfinite(flat(wrapped)).all())}  # fmt: skip
        wrapped.close()
    ref, _ = train("torch_ddp", rank, 6)
    wrapped, _ = train("dlcp", rank, 6, loss_bound=0.05, pull_loss_bound=0.05, **SMALL)
    diff = (flat(ref) - flat(wrapped)).abs().max() / flat(ref).abs().max()
    results["zero"] = {
        "diff": float(diff),
        "records": records(wrapped),
        "moved": float((flat(ref) - flat(mlp())).abs().max()),
    }
    wrapped.close()


def replicas(rank: int, world: int, results: dict[str, Any], *, every: int, steps: int, **_: Any) -> None:
    """Lossy pulls drift the replicas apart; the check every ``every`` steps makes them equal again."""
    results["steps"] = []

    def compare(wrapped: Any, step: int) -> None:
        grads = max(float(p.grad.abs().max()) for p in wrapped.module.parameters() if p.grad is not None)
        recs = wrapped.loss_records()  # flushes: this step's update is applied
        mine = flat(wrapped)
        pull_lost = sum(r.lost("pull") for r in recs if r.iteration == step)
        theirs = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(theirs, mine)
        info = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(info, torch.tensor([float(pull_lost), grads]))
        results["steps"].append({
            "iterations": step + 1,
            "differing": int((theirs[0] != theirs[1]).sum()),
            "max_diff": float((theirs[0] - theirs[1]).abs().max()),
            "pull_lost": sum(int(i[0]) for i in info),
            "max_grad": max(float(i[1]) for i in info),
        })  # fmt: skip

    opts = TransportOptions(inject_loss=0.2, inject_seed=9)
    wrapped, _ = train("dlcp", rank, steps, optimizer="sgd", after_step=compare, loss_bound=0.05,
                       pull_loss_bound=0.05, transport_options=opts, replica_check_every=every, **SMALL)  # fmt: skip
    results["checks"] = wrapped.replica_checks.checks
    results["mismatches"] = wrapped.replica_checks.mismatches
    results["repaired_at"] = wrapped.replica_checks.repaired_at
    wrapped.close()


def fuzz(rank: int, world: int, results: dict[str, Any], *, examples: int, **_: Any) -> None:
    """A clean run, then the same run under a flood of forged and malformed datagrams: same parameters."""
    opts = TransportOptions(key=KEY)
    clean, _ = train("dlcp", rank, STEPS, loss_bound=0.05, transport_options=opts, **SMALL)
    results["clean_lost"] = sum(r["lost"] for r in records(clean))
    clean_params = flat(clean)
    clean.close()
    tap = F.Tap() if rank == 0 else None
    fuzzer: list[threading.Thread] = []

    def start_fuzzing(wrapped: Any, step: int) -> None:
        if step == 3 and tap is not None:  # the dlcp plan runs from the third iteration
            transport = wrapped.engine._transports["dlcp"]
            fuzzer.append(F.start(transport, tap, examples, results))

    with F.tapping(tap):
        fuzzed, _ = train("dlcp", rank, STEPS, loss_bound=0.05, transport_options=opts, after_step=start_fuzzing,
                          **SMALL)  # fmt: skip
        for t in fuzzer:
            t.join(120)
        dist.barrier()  # the flood is over
        time.sleep(0.5)  # and read off the sockets
    link = fuzzed.engine._transports["dlcp"].link
    stats = link.stats
    results["counted"] = {"rejected": dict(stats.rejected), "mismatch": stats.mismatch, "late": stats.late,
                          "stale": stats.stale, "duplicate": stats.duplicate, "early_dropped": stats.early_dropped,
                          "early_buffered": stats.early_buffered,
                          "received": stats.received, "written": stats.written}  # fmt: skip
    results["socket_drops"] = fuzzed.engine._transports["dlcp"].drop_counters().socket
    results["send_errors"] = stats.send_errors
    results["fuzzed_lost"] = sum(r["lost"] for r in records(fuzzed))
    results["identical"] = bool(torch.equal(clean_params, flat(fuzzed)))
    results["max_diff"] = float((clean_params - flat(fuzzed)).abs().max())
    fuzzed.close()
