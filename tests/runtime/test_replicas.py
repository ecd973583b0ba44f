"""The replica check's digests and when a plan needs the check at all."""

from __future__ import annotations

import copy

import pytest
import torch

from commsched.runtime.replicas import check_every, digests, may_diverge
from commsched.schedule import NetworkEstimate, build_plan
from commsched.zoo import load as load_zoo

NET = NetworkEstimate(2, 1.25e9, 20e-6)


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_digests_agree_on_identical_replicas_and_tell_a_one_ulp_difference_in_parameters_or_state() -> None:
    model, opt = trained()
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.01)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # its own tensors, not opt's
    assert digests(list(model.parameters()), opt) == digests(list(twin.parameters()), twin_opt)
    p = next(twin.parameters())
    with torch.no_grad():
        p.view(-1)[3] = torch.nextafter(p.view(-1)[3], torch.tensor(1e9))
    assert digests(list(model.parameters()), opt)[1] != digests(list(twin.parameters()), twin_opt)[1]
    with torch.no_grad():
        p.copy_(next(model.parameters()))
    assert digests(list(model.parameters()), opt) == digests(list(twin.parameters()), twin_opt)
    state = twin_opt.state[p]["exp_avg_sq"].view(-1)
    state[0] = torch.nextafter(state[0], torch.tensor(1.0))
    layout, values = digests(list(twin.parameters()), twin_opt)
    assert layout == digests(list(model.parameters()), opt)[0] and values != digests(list(model.parameters()), opt)[1]
    twin_opt.state[p]["extra"] = 1
    assert digests(list(twin.parameters()), twin_opt)[0] != layout


def test_only_plans_whose_delivered_results_may_differ_need_the_check() -> None:
    workload = load_zoo("resnet18")
    assert not may_diverge(build_plan("ps", workload, NET))  # type: ignore[arg-type]
    assert not may_diverge(build_plan("ddp", workload, NET))  # type: ignore[arg-type]
    assert not may_diverge(build_plan("dlcp", workload, NET, loss_bound=0.05))  # type: ignore[arg-type]
    assert may_diverge(build_plan("dlcp", workload, NET, pull_loss_bound=0.001))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2.5, True, "50", None])
def test_replica_check_every_must_be_a_whole_number_at_least_zero(bad: object) -> None:
    with pytest.raises(ValueError, match=r"replica_check_every: must be a whole number >= 0 \(0: never\), got"):
        check_every(bad)
    assert check_every(0) == 0 and check_every(7) == 7


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"replica_check_every": -5}, "replica_check_every: must be"), ({"qdisc_drops": 7}, "qdisc_drops: must be")],
)
def test_parallelize_refuses_a_bad_replica_check_or_drop_counter_before_any_communication(
    world_of_one: None, kwargs: dict, message: str
) -> None:
    from commsched.runtime.api import parallelize

    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=message):
        parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), policy="dlcp", **kwargs)
