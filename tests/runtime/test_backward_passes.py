"""Gradients over several backward passes, on a world of one (the buffers' logic, no peer needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from commsched.errors import UnsupportedError


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 6)
        self.a = nn.Linear(6, 1)
        self.b = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.a(h), self.b(h)


def _grads_after_two_backward_passes(model: nn.Module, wrapped: nn.Module, opt: torch.optim.Optimizer) -> dict:
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(3):  # the second and third iterations run with p.grad already the bucket view
        opt.zero_grad()
        out_a, out_b = wrapped(x)
        out_a.sum().backward(retain_graph=True)  # reaches body and head a
        out_b.sum().backward()  # reaches body and head b, not head a
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("policy", ["ddp", "no_overlap", "horovod"])
def test_a_gradient_from_an_earlier_backward_pass_survives_a_pass_that_does_not_reach_it(
    world_of_one: None, policy: str
) -> None:
    from commsched.runtime.api import parallelize

    torch.manual_seed(0)
    plain = _TwoHeads()
    torch.manual_seed(0)
    model = _TwoHeads()
    expected = _grads_after_two_backward_passes(plain, plain, torch.optim.SGD(plain.parameters(), lr=0.1))
    wrapped, opt = parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy)
    try:
        got = _grads_after_two_backward_passes(model, wrapped, opt)
    finally:
        wrapped.close()
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert torch.allclose(got[name], grad, rtol=0, atol=1e-6), name
    assert got["a.weight"].abs().sum() > 0  # head a's gradient is there, not zeroed by the second pass


def test_a_gradient_arriving_twice_in_one_backward_is_refused_naming_the_parameter(world_of_one: None) -> None:
    from commsched.runtime.api import parallelize

    body = nn.Linear(4, 4)
    model = nn.Sequential(body, nn.Tanh())

    def twice(x: torch.Tensor) -> torch.Tensor:  # body used inside and outside a reentrant checkpoint
        inner = checkpoint(model, x, use_reentrant=True)
        return inner + body(x)

    wrapped, _ = parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), policy="ddp")
    try:
        x = torch.randn(3, 4, requires_grad=True)
        with pytest.raises(UnsupportedError, match=r"parameter '0\.(weight|bias)' received its gradient twice"):
            wrapped(x)  # runs the hooks' forward side
            twice(x).sum().backward()
    finally:
        wrapped.close()
