"""Deferred per-layer updates (``update="forward"``) and global-norm clipping.

At ``optimizer.step()`` nothing is applied: the hyper-parameters in force are
recorded (so an LR scheduler stepping afterwards does not change this step's
update) and every layer is marked pending. Just before a layer's next forward
— or at a flush — its gradients' tasks are awaited and the user's optimizer
runs on that layer's parameters alone, with the recorded hyper-parameters.
Parameters that received no gradient in the iteration are skipped, as the
optimizer would skip them under DDP.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from commsched.runtime.buffers import GradientBuffers
from commsched.schedule import CommPlan
from commsched.schedule.base import REDUCING_KINDS


class DeferredUpdates:
    """Pending updates of one plan's layers on one rank."""

    __slots__ = ("_hyper", "_optimizer", "_orig_step", "clip_coef", "pending")

    def __init__(self, optimizer: torch.optim.Optimizer, orig_step: Callable[[], Any]) -> None:
        self._optimizer = optimizer
        self._orig_step = orig_step
        self._hyper: list[dict[str, Any]] = []
        #: layer -> the instance whose gradients it still has to apply
        self.pending: dict[int, int] = {}
        self.clip_coef = 1.0

    def record_step(self, num_layers: int, instance: int, clip_coef: float) -> None:
        """``optimizer.step()`` of ``instance``: remember its hyper-parameters; every layer owes an update."""
        self._hyper = [{k: v for k, v in g.items() if k != "params"} for g in self._optimizer.param_groups]
        self.clip_coef = clip_coef
        self.pending = dict.fromkeys(range(num_layers), instance)

    def apply(
        self,
        layers: Sequence[int],
        tensors_of_layer: Sequence[Sequence[int]],
        buffers: GradientBuffers,
        got_grad: Sequence[int],
        wait_layer: Callable[[int, int], None],
    ) -> None:
        """Apply the pending updates of ``layers``: wait for their tasks, then one optimizer call for all."""
        todo = [li for li in layers if li in self.pending]
        if not todo:
            return
        params: list[torch.Tensor] = []
        saved: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for li in todo:
            instance = self.pending.pop(li)
            wait_layer(li, instance)
            for t in tensors_of_layer[li]:
                if got_grad[t] != instance:
                    continue  # unused this iteration: the optimizer skips it, as under DDP
                p = buffers.params[t]
                grad = buffers.averaged(t).view_as(p)
                if self.clip_coef != 1.0:
                    grad.mul_(self.clip_coef)
                saved.append((p, p.grad))
                p.grad = grad
                params.append(p)
        if params:
            self._run_optimizer_on(params)
        for p, g in saved:
            p.grad = g

    def _run_optimizer_on(self, params: list[torch.Tensor]) -> None:
        opt = self._optimizer
        chosen = {id(p) for p in params}
        current = opt.param_groups
        groups = []
        for group, hyper in zip(current, self._hyper, strict=True):
            ps = [p for p in group["params"] if id(p) in chosen]
            if ps:
                groups.append({**hyper, "params": ps})
        opt.param_groups = groups
        try:
            self._orig_step()
        finally:
            opt.param_groups = current


def due_layers(
    layer: int, pending: dict[int, int], final_tasks: Sequence[Sequence[int]], done: Callable[[int, int], bool]
) -> list[int]:
    """``layer``, and every other pending layer whose gradients have already arrived: one optimizer call.

    Applying an update before the layer's forward is due is harmless: it only needs its gradients.
    """
    due = [layer]
    for other, instance in pending.items():
        if other != layer and all(done(task, instance) for task in final_tasks[other]):
            due.append(other)
    return due


def averaged_square_norm(
    plan: CommPlan,
    buffers: GradientBuffers,
    got_grad: Sequence[int],
    instance: int,
    wait: Callable[[int, int], None],
    reduce_shards: Callable[[torch.Tensor], None],
) -> torch.Tensor:
    """‖averaged gradients‖² (float64) before any layer is updated: from this rank's reduce-scatter shards
    and one scalar all-reduce (``reduce_shards``) where every gradient is reduce-scattered, else (all-reduces,
    push/pull pairs, a mix) from the averaged gradients."""
    rs = [t.id for t in plan.tasks if t.kind == "reduce_scatter"]
    if rs and all(t.kind == "reduce_scatter" for t in plan.tasks if t.kind in REDUCING_KINDS):
        for task in rs:
            wait(task, instance)
        sq = buffers.shard_square_sum()
        assert sq is not None
        reduce_shards(sq)
        return sq
    sq = torch.zeros((), dtype=torch.float64, device=buffers.params[0].device)
    for t, got in enumerate(got_grad):
        if got == instance:
            for task in plan.final_tasks_of_tensor[t]:
                wait(task, instance)
            sq += buffers.averaged(t).double().pow(2).sum().to(sq.device)
    return sq


def clip_coefficient(max_norm: float, square_sum: torch.Tensor) -> float:
    """``min(1, max_norm / (‖g‖ + 1e-6))`` from the squared norm of the averaged gradients (PyTorch's rule)."""
    return min(1.0, max_norm / (math.sqrt(float(square_sum)) + 1e-6))
