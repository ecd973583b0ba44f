"""A policy whose transport this install lacks is refused at ``parallelize()``, before any communication."""

from __future__ import annotations

import pytest
import torch

import commsched
from commsched.errors import UnsupportedError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize(("policy", "knobs", "transport"), [("ps", {}, "'ps'"), ("dlcp", {"mode": "ps"}, "'dlcp_ps'")])
def test_a_policy_whose_transport_is_missing_is_refused_at_parallelize(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch, policy: str, knobs: dict, transport: str
) -> None:
    from commsched.transport import base

    monkeypatch.setattr(base, "TRANSPORTS", {k: v for k, v in base.TRANSPORTS.items() if k == "collective"})
    model = _model()
    with pytest.raises(UnsupportedError, match=rf"transport\(s\) {transport} not available"):
        commsched.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy, **knobs)
