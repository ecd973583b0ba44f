"""GradientBuffers.fill on one rank: each way a gradient reaches a task's buffer, read back as averaged."""

from __future__ import annotations

import torch
from torch import nn

from commsched.runtime.binding import bind_plan
from commsched.runtime.buffers import GradientBuffers
from commsched.runtime.warmup import unmeasured_workload
from commsched.schedule import NetworkEstimate, build_plan


def _buffers(policy: str, **knobs: object) -> GradientBuffers:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8)).double()
    plan = build_plan(policy, unmeasured_workload(model), NetworkEstimate(2, 1e9), **knobs)
    return GradientBuffers(plan, bind_plan(model, plan, 2).params, 2)


def _reduce_as_if_the_peer_sent_the_same(buffers: GradientBuffers) -> None:
    for task in buffers.plan.tasks:
        flat = buffers.buffer(task.id).flat
        flat.mul_(2)  # the all-reduce's sum over two ranks holding the same gradients


def test_copied_viewed_and_missing_gradients_come_back_averaged_every_iteration() -> None:
    buffers = _buffers("ddp", bucket_cap_mb=25)
    params = buffers.params
    for iteration in range(3):
        for t, p in enumerate(params):
            grad = torch.full_like(p, t + 1.0 + iteration)
            if t < 2 and iteration == 0:  # a fresh gradient from autograd: copied in, then p.grad is the view
                p.grad = grad
                buffers.fill(t, p.grad)
                buffers.attach_view(t)
                assert buffers.is_view(t)
            elif t < 2:  # zeroed in place (set_to_none=False), autograd accumulating into the bucket view
                assert buffers.is_view(t)
                p.grad.zero_()
                p.grad.add_(grad)
                buffers.fill(t, p.grad)
            elif t == 2:
                buffers.fill(t, grad)  # a gradient of its own: copied in
            else:
                buffers.fill(t, None)  # no gradient: zeros
        _reduce_as_if_the_peer_sent_the_same(buffers)
        for t, p in enumerate(params):
            expected = 0.0 if t == 3 else t + 1.0 + iteration
            assert torch.equal(buffers.averaged(t), torch.full_like(p, expected)), (iteration, t)
            if t < 2:
                assert torch.equal(p.grad, torch.full_like(p, expected)), (iteration, t)  # the average, no copy out


def test_a_gradient_accumulated_over_two_backward_passes_in_the_view_averages_the_sum() -> None:
    buffers = _buffers("ddp", bucket_cap_mb=25)
    p = buffers.params[0]
    p.grad = torch.full_like(p, 3.0)
    buffers.fill(0, p.grad)
    buffers.attach_view(0)
    _reduce_as_if_the_peer_sent_the_same(buffers)
    assert torch.equal(p.grad, torch.full_like(p, 3.0))
    p.grad.add_(torch.full_like(p, 5.0))  # a second backward without zero_grad, as under DDP: the average + 5
    buffers.fill(0, p.grad)
    _reduce_as_if_the_peer_sent_the_same(buffers)
    assert torch.equal(p.grad, torch.full_like(p, 8.0))


def test_a_parameter_is_not_given_its_view_before_its_gradient_is_ready() -> None:
    buffers = _buffers("ddp", bucket_cap_mb=25)
    assert all(p.grad is None for p in buffers.params)  # nothing attached at construction
    buffers.fill(1, None)
    assert buffers.params[1].grad is None  # no gradient: stays None, as under DDP


def test_a_tensor_cut_across_tasks_is_copied_piece_by_piece() -> None:
    buffers = _buffers("bytescheduler", partition_mb=0.004)
    split = [t for t in range(len(buffers.params)) if len(buffers.plan.tasks_reading_tensor[t]) > 1]
    assert split, "the partition should cut the 64x64 weight into several tasks"
    for t, p in enumerate(buffers.params):
        buffers.fill(t, torch.arange(p.numel(), dtype=p.dtype).view(p.shape) + t)
    _reduce_as_if_the_peer_sent_the_same(buffers)
    for t, p in enumerate(buffers.params):
        assert torch.equal(buffers.averaged(t), torch.arange(p.numel(), dtype=p.dtype).view(p.shape) + t), t
