"""The benchmark models: the parameter counts their docs state, deterministic weights and data."""

from __future__ import annotations

import pytest
import torch

from commsched.models import MODELS, build_model, model_loss, parameter_count, synthetic_batch

DOCUMENTED = {"resnet5m": 5_239_882, "gpt5m": 5_273_088, "transformer": 660_992, "cnn": None}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_model_has_its_documented_size_and_trains_on_its_synthetic_batch(name: str) -> None:
    model = build_model(name, seed=0)
    if DOCUMENTED[name] is not None:
        assert parameter_count(model) == DOCUMENTED[name]
    x, y = synthetic_batch(name, 2, seed=0, rank=1, step=3)
    loss = model_loss(model(x), y)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", ["resnet5m", "gpt5m"])
def test_the_same_seed_gives_the_same_weights_and_data_in_any_process(name: str) -> None:
    a, b = build_model(name, seed=7), build_model(name, seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    x1, y1 = synthetic_batch(name, 4, seed=0, rank=0, step=1)
    x2, y2 = synthetic_batch(name, 4, seed=0, rank=0, step=1)
    x3, _ = synthetic_batch(name, 4, seed=0, rank=1, step=1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)


def test_gpt5m_ties_its_output_to_the_embedding_whose_gradient_is_the_largest() -> None:
    model = build_model("gpt5m")
    assert model.out.weight is model.embed.weight
    assert max(p.numel() for p in model.parameters()) == model.embed.weight.numel() == 8192 * 256
