"""torch.compile: a compiled model is refused clearly; compiling the wrapper keeps training exact."""

from __future__ import annotations

import pytest
import torch

import commsched
from commsched.errors import UnsupportedError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_a_compiled_model_is_refused_naming_torch_compile(world_of_one: None) -> None:
    model = _model()
    with pytest.raises(UnsupportedError, match=r"torch\.compile: commsched works through forward pre-hooks"):
        commsched.parallelize(torch.compile(model), torch.optim.SGD(model.parameters(), lr=0.1), policy="ddp")


@pytest.mark.parametrize("policy", ["ddp", "dear"])
def test_compiling_the_wrapper_trains_exactly_as_without(world_of_one: None, policy: str) -> None:
    results = []
    for compiled in (False, True):
        model = _model()
        wrapped, opt = commsched.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy)
        run = torch.compile(wrapped) if compiled else wrapped
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            x = torch.randn(6, 8, generator=g)
            run(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        wrapped.flush()  # type: ignore[operator]
        results.append([p.detach().clone() for p in model.parameters()])
        wrapped.close()  # type: ignore[operator]
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
