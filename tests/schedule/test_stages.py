"""Plan format 3: parameter-server ranks and pipeline stages survive a round trip; bad ones are refused by field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from commsched.cluster import Cluster
from commsched.errors import ScheduleError, SpecError
from commsched.plan.staged import staged_commplan
from commsched.schedule import CommPlan, NetworkEstimate, build_plan
from commsched.schedule.stages import Pipeline, StageLayout
from commsched.workload import Workload
from commsched.zoo import load as load_zoo


@pytest.fixture(scope="module")
def resnet18() -> Workload:
    return load_zoo("resnet18")


def _cluster(world: int) -> Cluster:
    nodes = [
        {
            "name": f"n{i}",
            "devices": [{"name": "d", "speed": 1.0, "memory_gib": 1}],
            "nic": {"bandwidth_gbps": 10, "latency_us": 5},
        }
        for i in range(world)
    ]
    return Cluster.from_dict({"name": f"c{world}", "nodes": nodes})


def _staged(workload: Workload) -> CommPlan:
    layout = StageLayout((0, 10, 30), (Pipeline((0,), (0,), 4, 2), Pipeline((1, 2), (0, 2), 6, 3)), "1f1b")
    return staged_commplan(workload, _cluster(3), layout)


def test_servers_and_stages_survive_a_json_round_trip(resnet18: Workload, tmp_path: Path) -> None:
    with_servers = dataclasses.replace(build_plan("ddp", resnet18, NetworkEstimate(4, 1e9)), servers=(0, 2))
    staged = _staged(resnet18)
    for plan in (with_servers, staged):
        plan.save(tmp_path / "plan.json")
        data = json.loads((tmp_path / "plan.json").read_text())
        assert data["version"] == 3
        again = CommPlan.load(tmp_path / "plan.json")
        assert again.to_dict() == plan.to_dict() and again.servers == plan.servers and again.stages == plan.stages
    assert staged.global_batch == 10 and staged.batch_sizes is None
    assert staged.stages is not None and staged.stages.holders(0) == (0, 1) and staged.stages.holders(2) == (0, 2)
    assert [t.name for t in staged.tasks] == ["stage0", "stage1", "stage2"]


def test_a_version_2_file_loads_without_servers_or_stages_and_may_not_carry_them(resnet18: Workload) -> None:
    data = build_plan("ddp", resnet18, NetworkEstimate(2, 1e9)).to_dict()
    data["version"] = 2
    del data["servers"], data["stages"]
    plan = CommPlan.from_dict(data)
    assert plan.servers is None and plan.stages is None and plan.version == 3
    with pytest.raises(SpecError, match=r"servers: not a field of version 2 \(it came with version 3\)"):
        CommPlan.from_dict({**data, "servers": [0]})
    with pytest.raises(SpecError, match=r"stages: not a field of version 2"):
        CommPlan.from_dict({**data, "stages": _staged(resnet18).to_dict()["stages"]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(servers=[0, 0]), r"servers: ranks must be distinct, got \[0, 0\]"),
        (lambda d: d.update(servers=[5]), r"servers\[0\]: must be a rank >= 0 below 3, got 5"),
        (lambda d: d["stages"].update(starts=[0, 30, 10]), r"stages.starts: must begin at layer 0 and increase"),
        (lambda d: d["stages"].update(starts=[0, 10, 999]), r"a stage starts at layer 999, the model has \d+ layers"),
        (lambda d: d["stages"]["pipelines"].pop(), r"every rank of 3 exactly once, got ranks \[0\]"),
        (
            lambda d: d["stages"]["pipelines"][1].update(micro_batches=4),
            r"micro_batches: 4 does not divide the batch 6",
        ),
        (
            lambda d: d["stages"]["pipelines"][1].update(micro_batches=1),
            r"1f1b needs at least one micro-batch per stage",
        ),
        (lambda d: d["stages"]["pipelines"][1].update(first_stage=[1, 2]), r"first_stage: must begin at stage 0"),
        (lambda d: d.update(batch_sizes=[1, 1, 1]), r"batch_sizes: must be null when the plan has stages"),
        (lambda d: d["stages"].update(schedule="zb"), r"stages.schedule: one of 1f1b, gpipe, got 'zb'"),
    ],
)
def test_a_bad_servers_or_stages_field_is_refused_naming_it(change, message: str, resnet18: Workload) -> None:  # type: ignore[no-untyped-def]
    data = _staged(resnet18).to_dict()
    change(data)
    with pytest.raises(SpecError, match=message):
        CommPlan.from_dict(data)


def test_a_plan_made_in_code_with_bad_servers_is_refused(resnet18: Workload) -> None:
    plan = build_plan("ddp", resnet18, NetworkEstimate(2, 1e9))
    with pytest.raises(ScheduleError, match=r"servers\[0\]: must be a rank >= 0 below 2, got 2"):
        dataclasses.replace(plan, servers=(2,))
    assert dataclasses.replace(plan, servers=[1]).servers == (1,)  # type: ignore[arg-type]
