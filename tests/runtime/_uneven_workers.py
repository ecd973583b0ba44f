"""Spawned gloo ranks training with uneven per-rank batches, against one process on the global batch."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import commsched
from commsched.data import SplitBatchSampler
from commsched.runtime.api import parallelize

import _workers as W

SEED = 5
CLIP = 0.05
FEATURES, CLASSES = 6, 4


class Net(nn.Module):
    """No BatchNorm (its statistics are per rank by design); ``mid`` runs twice in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.mid(h))
        return self.out(torch.tanh(self.mid(h)))


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)


def dataset(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(samples, FEATURES, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, CLASSES, (samples,), generator=g))


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loader: DataLoader,
    *,
    clip: float | None = None,
    micro: bool = False,
    keep_grads: bool = False,
) -> None:
    """Mean cross-entropy per batch; ``micro``: two micro-batches, the first under ``no_sync()``, each loss
    scaled by its share of the rank's batch; ``clip``: clip_grad_norm_ (the one-process reference)."""
    loss_fn = nn.CrossEntropyLoss()
    for x, y in loader:
        if micro:
            half = len(x) // 2
            with model.no_sync():  # type: ignore[operator]
                (loss_fn(model(x[:half]), y[:half]) * (half / len(x))).backward()
            (loss_fn(model(x[half:]), y[half:]) * ((len(x) - half) / len(x))).backward()
        else:
            loss_fn(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=not keep_grads)
    if hasattr(model, "flush"):
        model.flush()


def uneven(rank: int, world: int, port: int, out: str, sizes: list[int], steps: int, policies: list[str]) -> None:
    """Every (policy, optimizer, clipping) with ``sizes`` vs one process on batches of ``sum(sizes)``."""
    W.init(rank, world, port)
    torch.manual_seed(0)
    base = Net().double()
    data = dataset(sum(sizes) * steps)
    results: dict[str, Any] = {}

    def loader(batch_sizes: list[int] | tuple[int, ...], r: int) -> DataLoader:
        return DataLoader(data, batch_sampler=SplitBatchSampler(len(data), batch_sizes, r, seed=SEED))

    def reference(optname: str, clip: float | None) -> dict[str, torch.Tensor]:
        model = Net().double()
        model.load_state_dict(base.state_dict())
        train(model, make_optimizer(optname, model), loader([sum(sizes)], 0), clip=clip)
        return params(model)

    def run(policy: str, optname: str, train_kw: dict[str, Any] | None = None, **kw: Any) -> dict[str, torch.Tensor]:
        model = Net().double()
        model.load_state_dict(base.state_dict())
        knobs = {} if policy == "torch_ddp" or "plan" in kw else {**W.SMALL_KNOBS[policy], "warmup_iters": 1}
        wrapped, opt = parallelize(model, make_optimizer(optname, model), policy=policy, **knobs, **kw)
        batch_sizes = getattr(wrapped, "batch_sizes", None) or kw.get("batch_sizes") or sizes
        if policy != "torch_ddp":
            key = "batch_size" if "batch_sizes" in kw or "plan" in kw else "batch_size_even"
            results.setdefault(key, []).append(wrapped.batch_size)
        train(wrapped, opt, loader(batch_sizes, rank), **(train_kw or {}))
        snap = params(wrapped)
        if kw.get("batch_sizes") and policy == "dear" and optname == "sgd":
            wrapped.plan.save(Path(out, f"plan.rank{rank}.json"))
        if hasattr(wrapped, "close"):
            wrapped.close()
        return snap

    try:
        refs = {(o, c): reference(o, c) for o in ("sgd", "adamw") for c in (None, CLIP)}
        start = params(base)
        results["moved"] = min(max_abs_diff(start, ref) for ref in refs.values())
        results["clip_effect"] = max_abs_diff(refs[("sgd", None)], refs[("sgd", CLIP)])
        for policy in policies:
            for optname in ("sgd", "adamw"):
                for clip in (None, CLIP):
                    got = run(policy, optname, batch_sizes=sizes, max_grad_norm=clip)
                    results[f"{policy}/{optname}/clip={clip}"] = max_abs_diff(refs[(optname, clip)], got)
        # the plan the dear run used (per-rank batches inside) run again from its file
        got = run("dear", "sgd", plan=str(Path(out, f"plan.rank{rank}.json")))
        results["plan_file/dear"] = max_abs_diff(refs[("sgd", None)], got)
        model = Net().double()
        plan_file = str(Path(out, f"plan.rank{rank}.json"))
        try:
            parallelize(model, make_optimizer("sgd", model), plan=plan_file, batch_sizes=[1] * world)
            results["plan_conflict"] = "accepted"
        except commsched.errors.PlanMismatchError as exc:
            results["plan_conflict"] = str(exc)
        # bucket views zeroed in place (zero_grad(set_to_none=False)), scaled in place as the gradients arrive
        got = run("ddp", "sgd", {"keep_grads": True}, batch_sizes=sizes)
        results["keep_grads/ddp"] = max_abs_diff(refs[("sgd", None)], got)
        # the control: the same uneven batches averaged as under DDP are not the one-process result
        results["unweighted/ddp"] = max_abs_diff(refs[("sgd", None)], run("ddp", "sgd"))
        results["errors"] = _refusals(base, world)
    except Exception:
        results["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def uneven_no_sync(rank: int, world: int, port: int, out: str, sizes: list[int], steps: int) -> None:
    """Gradient accumulation under ``no_sync()`` with uneven batches vs one process on the global batch."""
    W.init(rank, world, port)
    torch.manual_seed(0)
    base = Net().double()
    data = dataset(sum(sizes) * steps)
    results: dict[str, Any] = {}
    try:
        ref = Net().double()
        ref.load_state_dict(base.state_dict())
        full = DataLoader(data, batch_sampler=SplitBatchSampler(len(data), [sum(sizes)], 0, seed=SEED))
        train(ref, make_optimizer("sgd", ref), full)
        for policy in ("torch_ddp", "ddp", "dear"):
            model = Net().double()
            model.load_state_dict(base.state_dict())
            knobs = {} if policy == "torch_ddp" else {**W.SMALL_KNOBS[policy], "warmup_iters": 1}
            wrapped, opt = parallelize(model, make_optimizer("sgd", model), policy=policy, batch_sizes=sizes, **knobs)
            mine = DataLoader(data, batch_sampler=SplitBatchSampler(len(data), sizes, rank, seed=SEED))
            train(wrapped, opt, mine, micro=True)
            results[f"no_sync/{policy}"] = max_abs_diff(params(ref), params(wrapped))
            if hasattr(wrapped, "close"):
                wrapped.close()
    except Exception:
        results["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _refusals(base: nn.Module, world: int) -> dict[str, str]:
    """Bad per-rank batches are refused at parallelize(), before any communication (the same on every rank)."""
    out = {}
    cases: dict[str, Callable[[nn.Module, torch.optim.Optimizer], Any]] = {
        "length": lambda m, o: parallelize(m, o, policy="dear", batch_sizes=[2] * (world + 1)),
        "value": lambda m, o: parallelize(m, o, policy="ddp", batch_sizes=[3] + [0] * (world - 1)),
        "torch_ddp": lambda m, o: parallelize(m, o, policy="torch_ddp", batch_sizes=[1.5] * world),
    }
    for name, call in cases.items():
        model = Net().double()
        try:
            call(model, make_optimizer("sgd", model))
            out[name] = "accepted"
        except commsched.errors.CommschedError as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out
