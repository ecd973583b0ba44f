"""Per-layer gradient-norm histograms recorded from a real model's gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from commsched.errors import SpecError
from commsched.profile import record_grad_norms
from commsched.profile.magnitudes import chunk_norms, norm_histogram
from commsched.workload import Workload


def _workload(model: nn.Module) -> Workload:
    layers = [
        {"name": name, "tensors": [{"name": f"{name}.{p}", "numel": t.numel()} for p, t in mod.named_parameters()],
         "forward_ms": 0.1, "backward_ms": 0.2}
        for name, mod in model.named_children()
    ]  # fmt: skip
    return Workload.from_dict(
        {"model": "mlp", "batch_size": 4, "device": "cpu", "layers": layers,
         "provenance": {"kind": "measured", "source": "test"}}
    )  # fmt: skip


def test_each_layer_gets_the_histogram_of_its_chunk_norms() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 8))
    workload = _workload(model)
    with pytest.raises(SpecError, match="no gradient"):
        record_grad_norms(workload, model)
    model(torch.randn(4, 64)).square().sum().backward()
    recorded = record_grad_norms(workload, model, chunk_numel=100, bins=8)
    first = recorded.layers[0].grad_norms
    assert first is not None and first.chunk_numel == 100
    assert sum(first.counts) == -(-64 * 256 // 100) + -(-256 // 100)  # each tensor cut on its own
    assert Workload.from_json(recorded.to_json()) == recorded


def test_chunk_norms_and_zero_chunks() -> None:
    grad = torch.tensor([3.0, 4.0, 0.0, 0.0, 1.0])
    assert chunk_norms(grad, 2).tolist() == [5.0, 0.0, 1.0]
    hist = norm_histogram(chunk_norms(grad, 2), 2, bins=4)
    assert hist.edges[0] == 0.0 and hist.counts[0] == 1 and sum(hist.counts) == 3
