"""Uneven per-rank batches: each rank's gradient weighted by its share of the global batch.

When rank ``r`` computes a mean-reduced loss over its ``b_r`` samples, the
gradient of one process on the whole global batch ``B = Σ b`` is
``Σ_r (b_r / B) · ∇L_r``. With per-rank batches the runtime multiplies each
rank's local gradient by ``b_r / B`` as it enters the communication buffers
and the reduction *sums* (instead of dividing by the world size, which is
right only for equal batches). Everything after the reduction — ``p.grad``
for ``update="step"`` plans, the deferred per-layer updates, the
``max_grad_norm`` clipping — sees that combined gradient unchanged.

The batch sizes come from the plan (``CommPlan.batch_sizes``, written by
``commsched plan -o``) or from ``parallelize(..., batch_sizes=[...])``; they
are fixed for a run: every plan the run adopts later (after warm-up, a
re-plan, ``use_plan``) gets them, and one that names other batch sizes is
refused.
"""

# No ``from __future__ import annotations``: DDP checks a communication hook's annotations as objects.

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from commsched.errors import PlanMismatchError, SpecError
from commsched.schedule import CommPlan
from commsched.schedule.plan import batch_sizes_problems


def checked_batch_sizes(batch_sizes: Any, world: int) -> tuple[int, ...]:
    """``batch_sizes`` as a tuple of ``world`` whole numbers >= 1, or SpecError naming the entry and value."""
    problems = batch_sizes_problems(list(batch_sizes) if isinstance(batch_sizes, range) else batch_sizes, world)
    if problems:
        raise SpecError("parallelize argument", problems)
    return tuple(batch_sizes)


def run_batch_sizes(plan: CommPlan | None, batch_sizes: Any, world: int) -> tuple[int, ...] | None:
    """The per-rank batches of a run: the plan's, the argument's (they must agree when both are given), or None."""
    given = None if batch_sizes is None else checked_batch_sizes(batch_sizes, world)
    planned = None if plan is None else plan.batch_sizes
    if given is not None and planned is not None and given != planned:
        raise PlanMismatchError(
            f"batch_sizes: the plan has {list(planned)}, parallelize(batch_sizes=...) has {list(given)}; "
            "give one of them"
        )
    return given if given is not None else planned


def with_batch_sizes(plan: CommPlan, batch_sizes: tuple[int, ...] | None) -> CommPlan:
    """``plan`` carrying the run's per-rank batches; PlanMismatchError when it names others."""
    if plan.batch_sizes == batch_sizes:
        return plan
    if plan.batch_sizes is not None:
        run = "even batches" if batch_sizes is None else list(batch_sizes)
        raise PlanMismatchError(
            f"batch_sizes: the plan has {list(plan.batch_sizes)}, this run trains with {run}; "
            "the per-rank batches are fixed for a run"
        )
    return replace(plan, batch_sizes=batch_sizes)


def gradient_weight(batch_sizes: Sequence[int] | None, rank: int) -> float | None:
    """``b_rank / B``, the factor of this rank's gradient before the summing reduction (None: even batches,
    the reduction averages)."""
    if batch_sizes is None:
        return None
    return batch_sizes[rank] / sum(batch_sizes)


class WeightedAllReduce:
    """The state of :func:`weighted_allreduce_hook`: the group and this rank's weight ``b_r / B``."""

    __slots__ = ("group", "weight")

    def __init__(self, group: dist.ProcessGroup | None, weight: float) -> None:
        self.group = group
        self.weight = weight


def weighted_allreduce_hook(state: WeightedAllReduce, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch DDP's communication hook for per-rank batches (``policy="torch_ddp"``): the bucket times
    ``b_r / B``, then a summing all-reduce (DDP's default hook divides by the world size instead).
    ``ddp.register_comm_hook(WeightedAllReduce(group, weight), weighted_allreduce_hook)``."""
    tensor = bucket.buffer().mul_(state.weight)
    work = dist.all_reduce(tensor, group=state.group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])
