"""Spawned gloo ranks running heterogeneous plans (PS buckets, pipeline stages) against one process."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import _uneven_workers as U
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from commsched.data import SplitBatchSampler
from commsched.errors import RuntimeCommError
from commsched.runtime.api import parallelize
from commsched.runtime.memory import MemoryCap, MemoryCapError

import _workers as W


def reference(base: torch.nn.Module, optname: str, global_batch: int, steps: int) -> dict[str, torch.Tensor]:
    """One process on batches of ``global_batch``: the parameters every plan must reach."""
    model = U.Net().double()
    model.load_state_dict(base.state_dict())
    data = U.dataset(global_batch * steps)
    loader = DataLoader(data, batch_sampler=SplitBatchSampler(len(data), [global_batch], 0, seed=U.SEED))
    U.train(model, U.make_optimizer(optname, model), loader)
    return U.params(model)


def hetero(
    rank: int,
    world: int,
    port: int,
    out: str,
    ps_runs: list[tuple[str, str]],
    staged_runs: list[tuple[str, str]],
    caps: list[float],
    steps: int,
    bn_plan: str | None = None,
) -> None:
    """Every PS run, every staged run (with the memory caps), the BatchNorm run, in one set of processes."""
    W.init(rank, world, port)
    results: dict[str, Any] = {}
    try:
        ps_plans(rank, ps_runs, steps, results)
        staged_plans(rank, world, staged_runs, caps, steps, results)
        if bn_plan is not None:
            batchnorm_micro_batches(rank, bn_plan, steps, results)
    except Exception:
        results["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    if world == 2 and staged_runs and "error" not in results:
        dead_peer_in_a_pipeline(rank, staged_runs[0][0], results, Path(out, f"rank{rank}.json"))
    dist.destroy_process_group()


def dead_peer_in_a_pipeline(rank: int, path: str, results: dict[str, Any], out: Path) -> None:
    """The last rank of a pipeline dies before a step; the first must end with a RuntimeCommError, in time."""
    import os
    import time

    model = transformer()
    wrapped, _ = parallelize(model, U.make_optimizer("sgd", model), plan=path, timeout_s=20)
    if rank == 1:
        os._exit(0)
    x, y = sequences(wrapped.batch_size).tensors
    start = time.monotonic()
    try:
        wrapped.train_step(x, y, torch.nn.CrossEntropyLoss())
        results["dead_peer"] = "no error"
    except Exception as exc:
        results["dead_peer"] = f"{type(exc).__name__}: {exc}"
    results["dead_peer_s"] = time.monotonic() - start
    out.write_text(json.dumps(results))
    os._exit(0)


def ps_plans(rank: int, runs: list[tuple[str, str]], steps: int, results: dict[str, Any]) -> None:
    """Each ``(plan file, optimizer)`` run from its file vs one process on the plan's global batch."""
    torch.manual_seed(0)
    base = U.Net().double()
    for path, optname in runs:
        model = U.Net().double()
        model.load_state_dict(base.state_dict())
        wrapped, opt = parallelize(model, U.make_optimizer(optname, model), plan=path)
        sizes = wrapped.batch_sizes
        data = U.dataset(sum(sizes) * steps)
        U.train(wrapped, opt, DataLoader(data, batch_sampler=SplitBatchSampler(len(data), sizes, rank, seed=U.SEED)))
        got = U.params(wrapped)
        transports = wrapped.engine._transports
        key = f"{Path(path).stem}/{optname}"
        results[key] = U.max_abs_diff(reference(base, optname, sum(sizes), steps), got)
        results[f"{key}/transports"] = sorted(transports)
        if "ps" in transports:
            results[f"{key}/servers"] = transports["ps"].exchange.servers  # type: ignore[attr-defined]
        results["moved"] = U.max_abs_diff(U.params(base), got)
        wrapped.close()


# ---- pipeline stages ----

SEQ = 4


class MeanOverSequence(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def transformer(width: int = 16, blocks: int = 4) -> torch.nn.Sequential:
    """A small transformer encoder as an nn.Sequential (no BatchNorm, no dropout): the model stages cut."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(U.FEATURES, width)]
    for _ in range(blocks):
        layers.append(torch.nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True))
    layers += [MeanOverSequence(), torch.nn.Linear(width, U.CLASSES)]
    return torch.nn.Sequential(*layers).double()


def sequences(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, SEQ, U.FEATURES, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, U.CLASSES, (samples,), generator=g))


def staged_reference(optname: str, global_batch: int, steps: int) -> dict[str, torch.Tensor]:
    model = transformer()
    data = sequences(global_batch * steps)
    loader = DataLoader(data, batch_sampler=SplitBatchSampler(len(data), [global_batch], 0, seed=U.SEED))
    U.train(model, U.make_optimizer(optname, model), loader)
    return U.params(model)


def staged_plans(
    rank: int, world: int, runs: list[tuple[str, str]], caps: list[float], steps: int, results: dict[str, Any]
) -> None:
    """Each staged ``(plan file, optimizer)`` under this rank's memory cap vs one process on the global batch;
    then data parallelism on the same model under the same cap."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for path, optname in runs:
        model = transformer()
        opt = U.make_optimizer(optname, model)
        before = len(dist.distributed_c10d._world.pg_map)
        wrapped, opt = parallelize(model, opt, plan=path)
        cap = MemoryCap(caps[rank], rank=rank, device="small" if caps[rank] == min(caps) else "big")
        data = sequences(wrapped.plan.global_batch * steps)
        key = f"{Path(path).stem}/{optname}"
        losses = []
        for x, y in DataLoader(data, batch_sampler=wrapped.sampler(len(data), seed=U.SEED)):
            with cap.step(wrapped, opt, extra=wrapped.sync_buffers()):
                loss = wrapped.train_step(x, y, loss_fn)
                opt.step()
            opt.zero_grad()
            losses.append(None if loss is None else loss.item())
        ref = staged_reference(optname, wrapped.plan.global_batch, steps)
        mine = wrapped.owned_state_dict()
        results[key] = max((mine[k] - ref[k]).abs().max().item() for k in mine)
        results[f"{key}/owned"] = sorted({k.split(".")[0] for k in mine})
        results[f"{key}/held_bytes"] = cap.peak.total_bytes if cap.peak else None
        results[f"{key}/losses"] = losses
        results[f"{key}/moved"] = max((mine[k] - transformer().state_dict()[k]).abs().max().item() for k in mine)
        made = len(dist.distributed_c10d._world.pg_map)
        wrapped.close()
        wrapped.close()  # idempotent
        results[f"{key}/groups"] = (before, made, len(dist.distributed_c10d._world.pg_map))
        try:
            wrapped.train_step(x, y, loss_fn)
            results[f"{key}/after_close"] = "trained"
        except RuntimeCommError as exc:
            results[f"{key}/after_close"] = str(exc)
    if runs and world == 3:  # the control: every rank the whole model, even batches, under the same caps
        model = transformer()
        wrapped, opt = parallelize(model, U.make_optimizer("adamw", model), policy="ddp", warmup_iters=1)
        cap = MemoryCap(caps[rank], rank=rank, device="small" if caps[rank] == min(caps) else "big")
        data = sequences(2 * world)
        try:
            for x, y in DataLoader(data, batch_size=2):
                with cap.step(wrapped, opt):
                    loss_fn(wrapped(x), y).backward()
                    opt.step()
                break
            results["dp_under_cap"] = "fits"
        except MemoryCapError as exc:
            results["dp_under_cap"] = str(exc)
        wrapped.close()


# ---- BatchNorm: equal micro-batches, uneven accumulation counts ----


class BatchNormNet(torch.nn.Module):
    """No bias before the BatchNorm (its gradient is zero up to rounding, which AdamW would magnify)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(U.FEATURES, 16, bias=False)
        self.bn = torch.nn.BatchNorm1d(16)
        self.out = torch.nn.Linear(16, U.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.bn(self.inp(x))))


def batchnorm_net() -> BatchNormNet:
    torch.manual_seed(0)
    return BatchNormNet().double()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.named_parameters()}


def batchnorm_micro_batches(rank: int, path: str, steps: int, results: dict[str, Any]) -> None:
    """The plan's equal micro-batches (uneven counts per rank) vs one process accumulating the same
    micro-batches of the global batch; the control runs each rank's batch in one pass."""
    from commsched.data import micro_batches

    loss_fn = torch.nn.CrossEntropyLoss()
    model = batchnorm_net()
    wrapped, opt = parallelize(model, U.make_optimizer("adamw", model), plan=path)
    sizes, m = wrapped.batch_sizes, wrapped.micro_batch
    B = sum(sizes)
    data = U.dataset(B * steps)
    for x, y in DataLoader(data, batch_sampler=SplitBatchSampler(len(data), sizes, rank, seed=U.SEED)):
        for xs, ys, weight in micro_batches(wrapped, x, y):
            (loss_fn(wrapped(xs), ys) * weight).backward()
        opt.step()
        opt.zero_grad()
    wrapped.flush()
    got = _weights(wrapped)
    wrapped.close()
    ref = batchnorm_net()
    ref_opt = U.make_optimizer("adamw", ref)
    for x, y in DataLoader(data, batch_sampler=SplitBatchSampler(len(data), [B], 0, seed=U.SEED)):
        for xs, ys in zip(x.split(m), y.split(m), strict=True):
            (loss_fn(ref(xs), ys) * (m / B)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    results["bn/micro_batches"] = max((got[k] - v).abs().max().item() for k, v in _weights(ref).items())
    results["bn/sizes"] = [sizes, m]
    # the control: the same batches, each rank's in one pass
    model = batchnorm_net()
    wrapped, opt = parallelize(model, U.make_optimizer("adamw", model), policy="ddp", batch_sizes=sizes, warmup_iters=1)
    U.train(wrapped, opt, DataLoader(data, batch_sampler=SplitBatchSampler(len(data), sizes, rank, seed=U.SEED)))
    results["bn/one_pass"] = max((_weights(wrapped)[k] - v).abs().max().item() for k, v in _weights(ref).items())
    wrapped.close()
