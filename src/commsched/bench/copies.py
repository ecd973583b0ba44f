"""What PyTorch DDP's gradient copies cost a CPU worker, and the workload and update time that charge them.

``DistributedDataParallel(model)`` at its defaults (``gradient_as_bucket_view=False``)
keeps every bucket in a flat buffer of its own: as each gradient is ready,
its autograd hook copies it into the bucket (scaled by 1/world size, one
pass over its bytes) on the thread that runs the backward, and when every
bucket has been all-reduced, at the end of the backward, it copies each
bucket back into the gradients. The runtime's policies write gradients
straight into their communication buffers, and the references the
simulator is fitted to (compute in lock-step, one all-reduce alone) copy
nothing, so the simulator did not see these copies: on a CPU worker they
are memory traffic on the core that computes. On a GPU they are device
copies at its memory bandwidth, a small fraction of a millisecond per MiB.

:func:`time_bucket_copies` times them on the calibration's replica, as DDP
makes them: after a backward (the caches as the backward leaves them), the
gradients into one flat buffer in the order they become ready, scaled as
they go, then back, rounds after an untimed one.
:func:`with_bucket_copies` charges them: each layer's backward grows by the
copies of its gradients (every later gradient is ready that much later),
and the update by the copies back, which run after the last all-reduce.

On this repository's development host, one core, the gradients of resnet5m
and of gpt5m (20 MiB each) took 2.3 ms to copy in and 1.6-2.0 ms to copy
back: about 1.5 % of their iterations there. PyTorch DDP with and without
``gradient_as_bucket_view`` (``python benchmarks/runtime_cost.py --configs
torch,torch_view``, 2 gloo ranks over loopback) differed by -7 to +13 ms of
CPU per iteration over three runs of the two models, a spread that hides
the copies' 4 ms; BENCHMARKS.md, "PyTorch DDP's gradient copies, timed and
charged", has the figures.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from commsched.models import model_loss
from commsched.workload import Layer, Workload

__all__ = ["COPY_ROUNDS", "BucketCopies", "time_bucket_copies", "with_bucket_copies"]

#: Timed rounds (after one untimed round).
COPY_ROUNDS = 9


@dataclass(frozen=True)
class BucketCopies:
    """One rank's timed rounds, in ms: every gradient of ``nbytes`` in all copied into a flat buffer (``in``)
    and back (``out``)."""

    nbytes: int
    in_ms: tuple[float, ...]
    out_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.nbytes <= 0:
            raise ValueError(f"bucket_copies.nbytes: must be > 0, got {self.nbytes!r}")
        for name in ("in_ms", "out_ms"):
            times = getattr(self, name)
            if not times or min(times) < 0:
                raise ValueError(f"bucket_copies.{name}: needs timed rounds of >= 0 ms, got {times!r}")

    @property
    def in_ms_per_mb(self) -> float:
        """Copying gradients into a bucket, ms per MiB (median over rounds)."""
        return statistics.median(self.in_ms) / (self.nbytes / 2**20)

    @property
    def out_ms_per_mb(self) -> float:
        """Copying a bucket back into the gradients, ms per MiB (median over rounds)."""
        return statistics.median(self.out_ms) / (self.nbytes / 2**20)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> BucketCopies:
        """Read what :func:`dataclasses.asdict` wrote; a ValueError naming ``source`` where it does not fit."""
        try:
            return cls(
                int(data["nbytes"]),
                tuple(float(t) for t in data["in_ms"]),
                tuple(float(t) for t in data["out_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: bucket_copies: {exc}") from exc


def time_bucket_copies(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, torch.Tensor],
    world: int,
    progress: Callable[[int], None] = lambda _round: None,
) -> BucketCopies:
    """The rounds of the module docstring on this rank (no communication: every rank may call it alone)."""
    x, y = inputs
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    bucket = torch.empty(numel, dtype=torch.float32)
    offsets = list(itertools.accumulate((p.numel() for p in params), initial=0))
    scale = 1.0 / max(1, world)
    times: dict[str, list[float]] = {"in": [], "out": []}
    for i in range(1 + COPY_ROUNDS):
        model_loss(model(x), y).backward()
        grads = [(p.grad.view(-1), bucket[o : o + p.numel()]) for p, o in zip(params, offsets[:-1], strict=True)
                 if p.grad is not None]  # fmt: skip
        start = time.perf_counter()
        for grad, view in reversed(grads):  # ready order: the last layer's first
            torch.mul(grad, scale, out=view)
        copied_in = time.perf_counter()
        for grad, view in grads:
            grad.copy_(view)
        done = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if i:
            times["in"].append((copied_in - start) * 1e3)
            times["out"].append((done - copied_in) * 1e3)
        progress(i)
    return BucketCopies(numel * 4, tuple(times["in"]), tuple(times["out"]))


def with_bucket_copies(workload: Workload, update_ms: float, copies: BucketCopies) -> tuple[Workload, float]:
    """``workload`` and ``update_ms`` with PyTorch DDP's copies charged (the module docstring): every tensor's
    copy into its bucket at :attr:`BucketCopies.in_ms_per_mb`, on the backward as it becomes ready, and the
    copies back at :attr:`BucketCopies.out_ms_per_mb`, after the last all-reduce."""
    in_ms, out_ms = copies.in_ms_per_mb / 2**20, copies.out_ms_per_mb / 2**20  # per byte
    ready = workload.grad_ready_ms
    sizes = [t.bytes for t in workload.tensors]
    delay = [0.0] * len(ready)
    elapsed = 0.0
    for i in sorted(range(len(ready)), key=lambda k: (ready[k], -k)):  # ties: the later tensor is ready first
        elapsed += sizes[i] * in_ms
        delay[i] = elapsed
    layers: list[Layer] = []
    first = 0
    for layer in workload.layers:
        n = len(layer.tensors)
        shifted = tuple(ready[k] + delay[k] for k in range(first, first + n))
        layers.append(
            layer.model_copy(
                update={"backward_ms": layer.backward_ms + layer.bytes * in_ms, "grad_ready_ms": shifted or None}
            )
        )
        first += n
    return workload.model_copy(update={"layers": tuple(layers)}), update_ms + workload.total_bytes * out_ms
