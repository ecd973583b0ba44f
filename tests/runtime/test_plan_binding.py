"""Plan files refused at parallelize() when the model or the world differs; stages bound to an nn.Sequential;
parameter-server ranks checked; a step's memory measured and capped. One process, no communication."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_hetero_plans import cluster
from torch import nn

from commsched.errors import PlanMismatchError, SpecError, UnsupportedError
from commsched.plan.pipeline import cut_units
from commsched.plan.staged import staged_commplan
from commsched.runtime.api import parallelize
from commsched.runtime.memory import ActivationMeter, MemoryCap, MemoryCapError, held_bytes
from commsched.runtime.servers import run_transport_options
from commsched.runtime.stages import bind_stages
from commsched.runtime.warmup import unmeasured_workload
from commsched.schedule import CommPlan, NetworkEstimate, build_plan
from commsched.schedule.stages import Pipeline, StageLayout
from commsched.transport import TransportOptions


def _sequential(width: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(3, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 2)
    ).double()


def _plan(model: nn.Module, world: int = 1) -> CommPlan:
    return build_plan("ddp", unmeasured_workload(model), NetworkEstimate(world, 1e9))


def _staged(model: nn.Module, starts: tuple[int, ...], world: int = 2) -> CommPlan:
    pipe = Pipeline(tuple(range(world)), tuple(range(len(starts))) if world == len(starts) else (0,), 2, 2)
    return staged_commplan(unmeasured_workload(model), cluster(world), StageLayout(starts, (pipe,), "1f1b"))


@pytest.mark.usefixtures("world_of_one")
def test_a_plan_file_for_another_model_or_world_is_refused_at_parallelize(tmp_path: Path) -> None:
    _plan(_sequential()).save(tmp_path / "plan.json")
    wider = _sequential(width=5)
    with pytest.raises(PlanMismatchError, match=r"parameter '0.weight' has 12 fp64 elements in the plan, 15 fp64"):
        parallelize(wider, torch.optim.SGD(wider.parameters(), lr=0.1), plan=tmp_path / "plan.json")
    deeper = nn.Sequential(*_sequential(), nn.Linear(2, 2)).double()
    with pytest.raises(PlanMismatchError, match=r"the model has parameter\(s\) the plan does not: 5.bias, 5.weight"):
        parallelize(deeper, torch.optim.SGD(deeper.parameters(), lr=0.1), plan=tmp_path / "plan.json")
    floats = _sequential().float()
    with pytest.raises(PlanMismatchError, match=r"12 fp64 elements in the plan, 12 fp32 in the model"):
        parallelize(floats, torch.optim.SGD(floats.parameters(), lr=0.1), plan=tmp_path / "plan.json")
    _plan(_sequential(), world=3).save(tmp_path / "three.json")
    model = _sequential()
    with pytest.raises(PlanMismatchError, match=r"plan: made for 3 rank\(s\), this run has 1"):
        parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), plan=tmp_path / "three.json")


def test_stages_are_ranges_of_the_sequentials_children() -> None:
    model = _sequential()
    units = cut_units(unmeasured_workload(model))
    assert units == (0, 1, 2)  # layers "0", "2", "4": each its own child
    bound = bind_stages(model, _staged(model, (0, 2)), 2)
    assert bound.children == (range(0, 4), range(4, 5))  # the Tanh children go with the layers before them
    assert bound.task_stage == (0, 1)


def test_stages_that_cannot_run_are_refused_naming_why() -> None:
    model = _sequential()
    plan = _staged(model, (0, 2))

    class NotSequential(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _sequential()

    with pytest.raises(UnsupportedError, match=r"pipeline stages run on an nn\.Sequential"):
        bind_stages(NotSequential(), plan, 2)
    blocks = nn.Sequential(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4)), nn.Linear(4, 2)).double()
    inside = _staged(blocks, (0, 1))  # a cut between "0.0" and "0.1": inside child 0
    with pytest.raises(
        PlanMismatchError, match=r"stage 1 starts at layer '0.1', inside child '0' .* holds layer '0.0' of stage 0"
    ):
        bind_stages(blocks, inside, 2)
    one_bucket = _plan(model, 2).tasks
    assert len(one_bucket) == 1  # every gradient in one bucket: it spans both stages
    with pytest.raises(UnsupportedError, match=r"stages \[0, 1\]\): with pipeline stages every task is an all_reduce"):
        bind_stages(model, dataclasses.replace(plan, tasks=one_bucket), 2)
    by_ps = dataclasses.replace(plan, tasks=tuple(dataclasses.replace(t, transport="ps") for t in plan.tasks))
    with pytest.raises(UnsupportedError, match=r"on the 'collective' transport within one stage"):
        bind_stages(model, by_ps, 2)


@pytest.mark.usefixtures("world_of_one")
def test_arguments_a_staged_plan_cannot_take_are_refused() -> None:
    model = _sequential()
    plan = staged_commplan(unmeasured_workload(model), cluster(1), StageLayout((0,), (Pipeline((0,), (0,), 2, 1),)))
    with pytest.raises(
        UnsupportedError, match=r"max_grad_norm, batch_sizes not supported with a plan that has pipeline"
    ):
        parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), plan=plan, max_grad_norm=1.0, batch_sizes=[2])


def test_parameter_server_ranks_come_from_the_plan_or_the_options_and_are_checked() -> None:
    model = _sequential()
    plan = dataclasses.replace(_plan(model, 3), servers=(0,))
    assert run_transport_options(plan, None, 3) == TransportOptions(servers=(0,))
    assert run_transport_options(None, TransportOptions(servers=(2, 1)), 3) == TransportOptions(servers=(2, 1))
    assert run_transport_options(_plan(model, 3), None, 3) is None
    with pytest.raises(PlanMismatchError, match=r"servers: the plan has \[0\], transport_options.servers has \[1\]"):
        run_transport_options(plan, TransportOptions(servers=(1,)), 3)
    with pytest.raises(SpecError, match=r"servers\[0\]: must be a rank >= 0 below 3, got 3"):
        run_transport_options(None, TransportOptions(servers=(3,)), 3)
    dear = build_plan("dear", unmeasured_workload(model), NetworkEstimate(3, 1e9), threshold_mb=0.0001)
    sharded = dataclasses.replace(dear, tasks=tuple(dataclasses.replace(t, transport="ps") for t in dear.tasks))
    with pytest.raises(UnsupportedError, match=r"reduce_scatter on the 'ps' transport, which needs a server on every"):
        run_transport_options(dataclasses.replace(sharded, servers=(0,)), None, 3)
    assert run_transport_options(dataclasses.replace(sharded, servers=(0, 1, 2)), None, 3) is not None


def test_memory_of_a_step_is_its_state_plus_its_peak_activations() -> None:
    model = _sequential(width=64)
    params = sum(p.numel() for p in model.parameters()) * 8
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 3, dtype=torch.float64)
    cap = MemoryCap(10 * params, rank=3, device="T4")
    with cap.step(model, opt):
        model(x).square().mean().backward()
        opt.step()
    # parameters, gradients, two Adam moments, and AdamW's step count (a float32 scalar per parameter)
    assert cap.last is not None and cap.last.state_bytes == 4 * params + 6 * 4
    # the tanh outputs (32 x 64) and the linear inputs are saved; not the parameters
    assert 2 * 32 * 64 * 8 <= cap.last.activation_bytes < 10 * 32 * 64 * 8
    meter = ActivationMeter(exclude=list(model.parameters()))
    with meter.active():
        loss = model(x).square().mean()
        saved = meter.live_bytes
        loss.backward()
    del loss
    # freed once backward has used them, except the input, which the test still holds
    assert saved == meter.peak_bytes > 0 and meter.live_bytes == x.numel() * 8
    assert held_bytes([x, x[1:], torch.empty(0, device="meta")]) == 32 * 3 * 8
    small = MemoryCap(params, rank=3, device="T4")
    with (
        pytest.raises(MemoryCapError, match=r"rank 3 \(T4\): the step held .* MiB .*over its cap of .* MiB by"),
        small.step(model, opt),
    ):
        model(x).square().mean().backward()
        opt.step()
