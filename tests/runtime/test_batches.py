"""Per-rank batches in one process: argument checks, the plan's batches for a run, weighted buffers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from commsched.errors import PlanMismatchError, SpecError
from commsched.runtime.batches import checked_batch_sizes, gradient_weight, run_batch_sizes, with_batch_sizes
from commsched.runtime.binding import bind_plan
from commsched.runtime.buffers import GradientBuffers
from commsched.runtime.startup import Fingerprint, first_difference
from commsched.runtime.warmup import unmeasured_workload
from commsched.schedule import NetworkEstimate, build_plan


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def test_batch_sizes_argument_is_checked_naming_the_entry() -> None:
    assert checked_batch_sizes([1, 2, 3], 3) == (1, 2, 3) and checked_batch_sizes(range(1, 3), 2) == (1, 2)
    with pytest.raises(SpecError, match=r"batch_sizes: expected one entry per rank \(2\), got 3"):
        checked_batch_sizes([1, 2, 3], 2)
    with pytest.raises(SpecError, match=r"batch_sizes\[0\]: must be a whole number >= 1, got -1"):
        checked_batch_sizes([-1, 2], 2)


def test_a_run_has_the_plans_batches_or_the_arguments_and_refuses_two_different_ones() -> None:
    model = _model()
    plan = build_plan("ddp", unmeasured_workload(model), NetworkEstimate(2, 1e9))
    uneven = with_batch_sizes(plan, (1, 3))
    assert run_batch_sizes(uneven, None, 2) == (1, 3) and run_batch_sizes(plan, [2, 2], 2) == (2, 2)
    assert run_batch_sizes(uneven, (1, 3), 2) == (1, 3) and run_batch_sizes(plan, None, 2) is None
    with pytest.raises(PlanMismatchError, match=r"the plan has \[1, 3\], parallelize\(batch_sizes=...\) has \[3, 1\]"):
        run_batch_sizes(uneven, [3, 1], 2)
    assert with_batch_sizes(uneven, (1, 3)) is uneven
    with pytest.raises(PlanMismatchError, match=r"the plan has \[1, 3\], this run trains with even batches"):
        with_batch_sizes(uneven, None)
    assert gradient_weight((1, 3), 1) == 0.75 and gradient_weight(None, 0) is None


def test_ranks_that_disagree_on_batch_sizes_are_named_at_start_up() -> None:
    a = Fingerprint("dear", "[]", "none", (), 2, 2, (1, 2))
    b = Fingerprint("dear", "[]", "none", (), 2, 2, (2, 1))
    assert first_difference([a, b]) == "batch sizes: rank 0 has (1, 2), rank 1 has (2, 1)"


@pytest.mark.parametrize("view", [False, True], ids=["copied", "bucket_view"])
def test_weighted_buffers_read_back_the_weighted_sum_not_the_average(view: bool) -> None:
    """Two ranks' buffers, summed by hand as the all-reduce would: (1/4)·g0 + (3/4)·g1."""
    ranks = []
    for rank, scale in ((0, 1.0), (1, -2.0)):
        model = _model()
        plan = build_plan("ddp", unmeasured_workload(model), NetworkEstimate(2, 1e9), bucket_cap_mb=25)
        params = bind_plan(model, plan, 2).params
        buffers = GradientBuffers(plan, params, 2, gradient_weight((1, 3), rank))
        for t, p in enumerate(params):
            grad = torch.full_like(p, scale * (t + 1))
            if view:  # the previous iteration left p.grad as the view; zeroed in place and accumulated into
                buffers.attach_view(t)
                assert buffers.is_view(t)
                p.grad.zero_()
                p.grad.add_(grad)
            else:
                p.grad = grad
            buffers.fill(t, p.grad)
        ranks.append((plan, buffers))
    (plan, b0), (_, b1) = ranks
    for task in plan.tasks:  # the all-reduce: each rank's buffer becomes the sum
        total = b0.buffer(task.id).flat + b1.buffer(task.id).flat
        b0.buffer(task.id).flat.copy_(total)
    for t, p in enumerate(b0.params):
        expected = 0.25 * (t + 1) + 0.75 * (-2.0) * (t + 1)
        assert torch.allclose(b0.averaged(t), torch.full_like(p, expected), rtol=0, atol=1e-15)
