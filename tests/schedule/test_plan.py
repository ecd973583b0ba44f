"""CommPlan: typed, versioned, saved and read back as JSON; bad files are refused by field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from commsched.errors import ScheduleError, SpecError
from commsched.schedule import POLICIES, CommPlan, NetworkEstimate, build_plan, knob_class
from commsched.zoo import load as load_zoo

SMALL = {
    "ddp": {"bucket_cap_mb": 4.0, "rebuilt": False},
    "horovod": {"fusion_threshold_mb": 8.0},
    "bytescheduler": {"partition_mb": 2.0},
    "prophet": {"partition_mb": 2.0, "bandwidth_gbps": 25.0},
    "dear": {"threshold_mb": 8.0, "lookahead": 2},
    "no_overlap": {"bucket_cap_mb": 16.0},
    "ps": {"partition_mb": 2.0, "credit_mb": 8.0},
    "dlcp": {"partition_mb": 2.0, "credit_mb": 8.0, "mode": "ps", "loss_bound": 0.05},
    "wfbp": {},
    "mgwfbp": {"alpha_ms": 2.0},
}


@pytest.fixture(scope="module")
def resnet18() -> object:
    return load_zoo("resnet18")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policys_plan_survives_a_json_round_trip(policy: str, resnet18: object, tmp_path: Path) -> None:
    plan = build_plan(policy, resnet18, NetworkEstimate(8, 1.25e9, 20e-6), **SMALL[policy])  # type: ignore[arg-type]
    path = tmp_path / "sub" / "plan.json"
    plan.save(path)
    again = CommPlan.load(path)
    assert again.tasks == plan.tasks
    assert again.knobs == plan.knobs and type(again.knobs) is knob_class(policy)
    assert again.network == plan.network and again.update == plan.update and again.policy == policy
    assert again.workload == plan.workload
    assert again.to_dict() == plan.to_dict()
    resolved = {"fuse_kb": 64.0} if policy == "ps" else {}  # ps records the size it fused at (the 64 KiB floor)
    assert again.knobs.to_dict() == {**knob_class(policy).defaults(), **SMALL[policy], **resolved}


def test_the_network_a_plan_was_made_for_is_stated_inside(resnet18: object) -> None:
    plan = build_plan("prophet", resnet18, NetworkEstimate(8, 1.25e9), bandwidth_gbps=25.0)  # type: ignore[arg-type]
    assert plan.to_dict()["network"] == {"world_size": 8, "bandwidth_bytes_per_s": 25e9 / 8, "latency_s": 0.0}


def _plan_dict(resnet18: object) -> dict:
    return build_plan("dear", resnet18, NetworkEstimate(2, 1e9)).to_dict()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="other"), r"format: expected 'commsched.CommPlan'"),
        (lambda d: d.update(version=99), r"version: this commsched reads versions 1, 2, 3, got 99"),
        (
            lambda d: d.update(batch_sizes=[1, 2, 3]),
            r"batch_sizes: expected one entry per rank \(2\), got 3: \[1, 2, 3\]",
        ),
        (lambda d: d.update(batch_sizes=[4, 0]), r"batch_sizes\[1\]: must be a whole number >= 1, got 0"),
        (lambda d: d.update(batch_sizes=[4, 2.5]), r"batch_sizes\[1\]: must be a whole number >= 1, got 2.5"),
        (lambda d: d.update(batch_sizes=[4, True]), r"batch_sizes\[1\]: must be a whole number >= 1, got True"),
        (lambda d: d.update(batch_sizes="4,2"), r"batch_sizes: expected a list or null, got '4,2'"),
        (lambda d: d.update(version=1, batch_sizes=[1, 2]), r"batch_sizes: not a field of version 1"),
        (lambda d: d.pop("tasks"), r"tasks: missing"),
        (lambda d: d.update(policy="fastest"), r"unknown policy 'fastest'"),
        (lambda d: d["knobs"].update(threshold_mb=-1), r"knob 'threshold_mb' must be a number > 0, got -1"),
        (lambda d: d["knobs"].update(colour=1), r"unknown knob\(s\) 'colour'"),
        (lambda d: d["tasks"][0]["segments"].pop(), r"elements reduced"),
        (lambda d: d["tasks"][0].update(kind="broadcast"), r"unknown kind 'broadcast'"),
        (lambda d: d["tasks"][0].update(loss_bound=1.5), r"loss_bound 1.5; must be in \[0, 1\)"),
        (lambda d: d["tasks"][1].pop("segments"), r"tasks\[1\].segments: missing"),
    ],
)
def test_a_bad_plan_file_is_refused_naming_the_field(change, message: str, resnet18: object, tmp_path: Path) -> None:
    data = _plan_dict(resnet18)
    change(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=message) as info:
        CommPlan.load(path)
    assert str(path) in str(info.value)


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        CommPlan.load(path)
    with pytest.raises(SpecError, match="cannot read"):
        CommPlan.load(tmp_path / "missing.json")


def test_per_rank_batch_sizes_survive_a_json_round_trip(resnet18: object, tmp_path: Path) -> None:
    plan = build_plan("dear", resnet18, NetworkEstimate(3, 1e9))  # type: ignore[arg-type]
    uneven = dataclasses.replace(plan, batch_sizes=(16, 32, 48))
    assert uneven.global_batch == 96 and plan.global_batch is None and plan.batch_sizes is None
    path = tmp_path / "plan.json"
    uneven.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 3 and data["batch_sizes"] == [16, 32, 48]
    again = CommPlan.load(path)
    assert again.batch_sizes == (16, 32, 48) and again.to_dict() == uneven.to_dict()
    assert CommPlan.from_dict(plan.to_dict()).batch_sizes is None


def test_a_version_1_file_loads_as_a_plan_with_even_batches(resnet18: object) -> None:
    data = _plan_dict(resnet18)
    data["version"] = 1
    del data["batch_sizes"]
    plan = CommPlan.from_dict(data)
    assert plan.batch_sizes is None and plan.version == 3
    assert plan.tasks == CommPlan.from_dict(_plan_dict(resnet18)).tasks


def test_a_plan_made_in_code_with_bad_batch_sizes_is_refused(resnet18: object) -> None:
    plan = build_plan("ddp", resnet18, NetworkEstimate(2, 1e9))  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match=r"batch_sizes: expected one entry per rank \(2\), got 1: \[8\]"):
        dataclasses.replace(plan, batch_sizes=(8,))
    assert dataclasses.replace(plan, batch_sizes=[3, 5]).batch_sizes == (3, 5)  # type: ignore[arg-type]


def test_a_measured_cpu_cost_of_communication_travels_with_the_plan(resnet18: object) -> None:
    network = NetworkEstimate(2, 1e9, 50e-6, cpu_per_message_s=2e-4, cpu_s_per_byte=1e-9)
    plan = build_plan("ddp", resnet18, network)  # type: ignore[arg-type]
    again = CommPlan.from_json(plan.to_json())
    assert again.network == network
    assert again.to_dict()["network"]["cpu_per_message_s"] == 2e-4


def test_a_transport_measured_apart_travels_with_the_plan_and_a_bad_entry_is_refused(resnet18: object) -> None:
    network = NetworkEstimate(2, 1e9, transport_cpu=(("ps", 3e-4, 2e-10),))
    again = CommPlan.from_json(build_plan("ddp", resnet18, network).to_json())  # type: ignore[arg-type]
    assert again.network == network and again.network.transport_cpu == (("ps", 3e-4, 2e-10),)
    assert "transport_cpu" not in NetworkEstimate(2, 1e9).to_dict()  # plans from a cluster spec stay as before
    for bad in [(("ps", -1e-4, 0.0),), (("ps", 1e-4),), ((7, 1e-4, 0.0),), "ps", (("ps", float("nan"), 0.0),)]:
        with pytest.raises(ScheduleError, match=r"transport_cpu must be \(transport, seconds per task"):
            NetworkEstimate(2, 1e9, transport_cpu=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["latency_s", "cpu_per_message_s", "cpu_s_per_byte"])
@pytest.mark.parametrize("value", [-1e-6, float("nan"), float("inf"), True])
def test_a_network_estimate_refuses_a_cost_that_is_not_a_finite_number_at_least_zero(field: str, value: object) -> None:
    with pytest.raises(ScheduleError, match=f"{field} must be a finite number >= 0"):
        NetworkEstimate(2, 1e9, **{field: value})  # type: ignore[arg-type]
