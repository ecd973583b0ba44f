"""The dlcp policy: the parameter server's schedule with bounded-loss transports."""

from __future__ import annotations

import pytest

from commsched.cluster import load_cluster
from commsched.errors import ScheduleError
from commsched.plan import advise
from commsched.schedule import LOSSLESS, NetworkEstimate, build_plan
from commsched.schedule.dlcp import DLCP_PS_TRANSPORT, DLCP_TRANSPORT, DLCPKnobs
from commsched.schedule.ps import PSKnobs
from commsched.sim import simulate
from commsched.zoo import load as load_zoo

NET = NetworkEstimate(4, 1.25e9, 20e-6)


@pytest.fixture(scope="module")
def resnet18() -> object:
    return load_zoo("resnet18")


def test_pushes_carry_the_loss_bound_and_pulls_the_pull_bound(resnet18: object) -> None:
    plan = build_plan("dlcp", resnet18, NET, loss_bound=0.05, pull_loss_bound=0.001)  # type: ignore[arg-type]
    kinds = {t.kind for t in plan.tasks}
    assert kinds == {"push", "pull"}
    assert all(t.loss_bound == (0.05 if t.kind == "push" else 0.001) for t in plan.tasks)
    assert not plan.lossless
    assert all(t.transport == DLCP_TRANSPORT for t in plan.tasks)


def test_mode_chooses_the_transport(resnet18: object) -> None:
    plan = build_plan("dlcp", resnet18, NET, mode="ps")  # type: ignore[arg-type]
    assert {t.transport for t in plan.tasks} == {DLCP_PS_TRANSPORT}


def test_same_partitions_and_order_as_the_lossless_parameter_server(resnet18: object) -> None:
    ps = build_plan("ps", resnet18, NET, partition_mb=2.0, fuse_kb=64)  # type: ignore[arg-type]
    dlcp = build_plan("dlcp", resnet18, NET, partition_mb=2.0, loss_bound=0.0)  # type: ignore[arg-type]
    assert [(t.kind, t.segments, t.priority, t.deps) for t in ps.tasks] == [
        (t.kind, t.segments, t.priority, t.deps) for t in dlcp.tasks
    ]
    assert dlcp.lossless  # a zero bound is lossless
    unfused = build_plan("ps", resnet18, NET, partition_mb=2.0, fuse_kb=0)  # type: ignore[arg-type]
    assert len(dlcp.tasks) < len(unfused.tasks)


def test_a_run_recorded_before_fusion_is_rebuilt_unfused() -> None:
    assert DLCPKnobs().fuse_kb == 64
    assert DLCPKnobs.as_recorded({"partition_mb": 4.0})["fuse_kb"] == 0  # recorded before the knob existed
    assert DLCPKnobs.as_recorded(None) == {"fuse_kb": 0.0}
    assert DLCPKnobs.as_recorded({"fuse_kb": 64.0}) == {"fuse_kb": 64.0}
    # ps's default changed from 0 to 64: a run recorded without the knob was unfused
    assert PSKnobs.as_recorded({"partition_mb": 4.0}) == {"partition_mb": 4.0, "fuse_kb": 0.0}


@pytest.mark.parametrize(
    ("knobs", "field"),
    [({"loss_bound": 1.0}, "loss_bound"), ({"pull_loss_bound": -0.1}, "pull_loss_bound"), ({"mode": "ring"}, "mode")],
)
def test_bad_knobs_are_refused_naming_them(resnet18: object, knobs: dict, field: str) -> None:
    with pytest.raises(ScheduleError, match=field):
        build_plan("dlcp", resnet18, NET, **knobs)  # type: ignore[arg-type]


def test_auto_and_advise_leave_it_out_and_the_flow_model_marks_it_unvalidated(resnet18: object) -> None:
    assert "dlcp" not in LOSSLESS
    cluster = load_cluster("8xV100-10GbE")
    advice = advise(resnet18, cluster, budget_s=2.0)  # type: ignore[arg-type]
    assert all(c.policy != "dlcp" for c in advice.candidates)
    result = simulate(resnet18, cluster, "dlcp", 3, 1, trace=False)  # type: ignore[arg-type]
    assert result.unvalidated and "bounded-loss" in result.unvalidated
    assert simulate(resnet18, cluster, "ps", 3, 1, trace=False).unvalidated is None  # type: ignore[arg-type]


def test_one_server_is_slower_than_a_server_on_every_worker(resnet18: object) -> None:
    cluster = load_cluster("8xV100-10GbE")
    spread = simulate(resnet18, cluster, "dlcp", 5, 1, trace=False)  # type: ignore[arg-type]
    incast = simulate(resnet18, cluster, "dlcp", 5, 1, trace=False, mode="ps")  # type: ignore[arg-type]
    assert incast.iteration_ms > spread.iteration_ms


def test_ps_fuses_small_tensors_by_default() -> None:
    assert PSKnobs().fuse_kb is None  # from the network: at least below 64 KiB
    assert PSKnobs.as_recorded({"partition_mb": 4.0, "fuse_kb": 0.0})["fuse_kb"] == 0
