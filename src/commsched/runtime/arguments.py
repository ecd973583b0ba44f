"""What ``parallelize`` refuses before it starts anything: each error names the argument and its value."""

from __future__ import annotations

import math

import torch
from torch import nn

from commsched.errors import UnsupportedError
from commsched.schedule import AUTO, TORCH_DDP, updating_at

#: Optimizers that need every parameter at once (a closure), which per-layer updates cannot give.
_UNSPLITTABLE = ("LBFGS",)

_COMPILE_REFUSAL = (
    "torch.compile: commsched works through forward pre-hooks and gradient hooks, which a compiled graph does "
    "not keep; pass the uncompiled model to parallelize() and do not compile the model it returns"
)


def check_arguments(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    timeout_s: float,
    warmup_iters: int,
    bandwidth_gbps: float | None,
    latency_us: float,
) -> None:
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise UnsupportedError(_COMPILE_REFUSAL)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model: {type(model).__name__} has no trainable parameters (none, or all frozen); nothing to synchronise"
        )
    if type(optimizer).__name__ in _UNSPLITTABLE:
        raise UnsupportedError(
            f"optimizer: {type(optimizer).__name__} needs every parameter at once (closure); "
            "commsched applies updates per layer, use a per-parameter optimizer such as SGD or AdamW"
        )
    if max_grad_norm is not None and not (is_number(max_grad_norm) and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm: must be a finite number > 0, got {max_grad_norm!r}")
    if not (is_number(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s: must be a finite number > 0, got {timeout_s!r}")
    if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) or warmup_iters < 1:
        raise ValueError(f"warmup_iters: must be a whole number >= 1, got {warmup_iters!r}")
    if bandwidth_gbps is not None and not (is_number(bandwidth_gbps) and bandwidth_gbps > 0):
        raise ValueError(f"bandwidth_gbps: must be a finite number > 0, got {bandwidth_gbps!r}")
    if not (is_number(latency_us) and latency_us >= 0):
        raise ValueError(f"latency_us: must be a finite number >= 0, got {latency_us!r}")


def is_number(value: object) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def grad_scaler_refusal(policy: str) -> str:
    if policy == AUTO:
        return (
            "GradScaler: pass it to parallelize(..., policy='auto', grad_scaler=scaler), so that auto chooses "
            "among the policies that apply updates at step()"
        )
    steps = ", ".join([TORCH_DDP, *updating_at("step")])
    return (
        f"GradScaler: {policy} applies updates after step() returns, when the scaler has moved on; "
        f"use bf16 autocast (no scaler needed) or a policy that updates at step() ({steps})"
    )
