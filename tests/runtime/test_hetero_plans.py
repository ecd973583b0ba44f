"""Heterogeneous plans run as planned: buckets mixing collective all-reduce and parameter-server sync.

The plans come from the planner's code (``plan_for``/``with_sync`` on a
profile of the test model, and ``plan_heterogeneous`` itself), are saved and
run from their files with uneven per-rank batches; float64, so one process on
the global batch is matched to summation order (far below 1e-10).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import _hetero_workers as H
import _uneven_workers as U
import pytest
import torch

from commsched.cluster import Cluster
from commsched.plan.hetero import plan_heterogeneous
from commsched.plan.memory import GIB, MemoryModel
from commsched.plan.pipeline import cut_units
from commsched.plan.search import with_sync
from commsched.plan.staged import StagedPlan, plan_deployment, staged_commplan
from commsched.profile import profile_model
from commsched.runtime.memory import activation_bytes_per_sample
from commsched.schedule import CommPlan
from commsched.schedule.stages import Pipeline, StageLayout
from commsched.sim.options import SimOptions
from commsched.sim.simulator import plan_for
from commsched.workload import Workload

from _workers import SMALL_KNOBS
from conftest import spawn

pytestmark = pytest.mark.multiproc
TOL = 1e-10
STEPS = 3
SIZES = {2: (1, 2), 3: (1, 2, 3)}


def cluster(world: int, servers: int | None = 1) -> Cluster:
    """Node 0 twice as fast as the others, one device per node; ``servers`` colocated on the first nodes."""
    nodes = [
        {
            "name": f"n{i}",
            "devices": [{"name": "fast" if i == 0 else "slow", "speed": 1.0 if i == 0 else 0.5, "memory_gib": 1}],
            "nic": {"bandwidth_gbps": 1.0 if i == 0 else 0.5, "latency_us": 50.0},
        }
        for i in range(world)
    ]
    spec: dict = {"name": f"hetero-{world}", "nodes": nodes}
    if servers:
        spec["servers"] = {"count": servers, "colocated": True}
    return Cluster.from_dict(spec)


@pytest.fixture(scope="module")
def workload() -> Workload:
    torch.manual_seed(0)
    x, y = U.dataset(4).tensors
    return profile_model(
        U.Net().double(),
        lambda: (x, y),
        torch.nn.CrossEntropyLoss(),
        batch_size=4,
        model_name="Net",
        warmup=1,
        repeats=2,
    )


def mixed(workload: Workload, world: int, servers: tuple[int, ...] | None) -> CommPlan:
    """ddp's buckets, every other one by parameter server (the planner's ``with_sync``), the rest collective."""
    spec = cluster(world)
    by_ps = with_sync(plan_for(workload, spec, "ddp", **SMALL_KNOBS["ddp"]), "ps", spec, SimOptions())
    tasks = tuple(
        dataclasses.replace(t, transport="ps" if i % 2 == 0 else "collective") for i, t in enumerate(by_ps.tasks)
    )
    return dataclasses.replace(by_ps, tasks=tasks, batch_sizes=SIZES[world], servers=servers)


@functools.cache
def staged_workload() -> Workload:
    """The transformer's profile, with its activation memory per sample measured."""
    model = H.transformer()
    x, y = H.sequences(2).tensors
    loss_fn = torch.nn.CrossEntropyLoss()
    workload = profile_model(
        model, lambda: (x, y), loss_fn, batch_size=2, model_name="Transformer", warmup=1, repeats=2
    )
    act = activation_bytes_per_sample(model, 2, lambda: loss_fn(model(x), y).backward())
    return workload.model_copy(update={"extra": {**workload.extra, "activation_bytes_per_sample": act}})


def small_memory_bytes(workload: Workload) -> float:
    """A device that one sample of the whole model (AdamW) overflows 1.5 times."""
    return MemoryModel().bytes_for(workload, 1) / 1.5


def staged_cluster(workload: Workload) -> Cluster:
    """One device with room for the model, two that hold two thirds of it, at half its speed."""
    small_gib = small_memory_bytes(workload) / GIB
    nodes = [
        {"name": "n0", "devices": [{"name": "big", "speed": 1.0, "memory_gib": 4 * small_gib}]},
        {"name": "n1", "devices": [{"name": "small", "speed": 0.5, "memory_gib": small_gib}]},
        {"name": "n2", "devices": [{"name": "small", "speed": 0.5, "memory_gib": small_gib}]},
    ]
    for node in nodes:
        node["nic"] = {"bandwidth_gbps": 1.0, "latency_us": 50.0}
    return Cluster.from_dict({"name": "staged-3", "nodes": nodes})


def constructed(workload: Workload, world: int, layout: StageLayout) -> CommPlan:
    return staged_commplan(workload, staged_cluster(workload) if world == 3 else cluster(world), layout)


@dataclasses.dataclass
class Runs:
    world: int
    ps: list[tuple[str, str]]
    staged: list[tuple[str, str]]
    caps: list[float]
    results: list[dict]
    staged_plan: StagedPlan | None = None


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def runs(request: pytest.FixtureRequest, workload: Workload, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    world = request.param
    out = tmp_path_factory.mktemp(f"hetero{world}")
    spec = cluster(world)
    # SGD and AdamW on each world, with buckets by PS; one process per world runs them all (spawns are costly)
    ps: dict[str, tuple[CommPlan, tuple[str, ...]]] = {}
    if world == 2:
        ps["mixed_owner0"] = (mixed(workload, world, (0,)), ("sgd", "adamw"))  # reduce-to-owner on rank 0
        # DeAR's reduce-scatter/all-gather pairs on the parameter server (a server on every rank)
        dear = with_sync(plan_for(workload, spec, "dear", **SMALL_KNOBS["dear"]), "ps", spec, SimOptions())
        ps["dear_ps"] = (dataclasses.replace(dear, batch_sizes=SIZES[world]), ("adamw",))
    else:
        ps["mixed_owner0"] = (mixed(workload, world, (0,)), ("adamw",))
        ps["mixed_every_rank"] = (mixed(workload, world, None), ("sgd",))
        planned_ps = plan_heterogeneous(workload, spec, global_batch=sum(SIZES[world]), budget_s=0.5, trials=1)
        assert planned_ps.plan.servers in (None, (0,))
        ps["planner"] = (planned_ps.plan, ("adamw",))
    mixed_tasks = ps["mixed_owner0"][0].tasks
    assert len(mixed_tasks) >= 3 and {t.transport for t in mixed_tasks} == {"collective", "ps"}
    tw = staged_workload()
    units = cut_units(tw)
    small = small_memory_bytes(tw)
    staged: dict[str, tuple[CommPlan, tuple[str, ...]]] = {}
    planned = None
    if world == 2:
        two = Pipeline((0, 1), (0, 1), 3, 3)
        staged["two_stages_1f1b"] = (constructed(tw, 2, StageLayout((0, units[3]), (two,), "1f1b")), ("sgd",))
        staged["two_stages_gpipe"] = (constructed(tw, 2, StageLayout((0, units[3]), (two,), "gpipe")), ("adamw",))
        caps = [small, small]
    else:
        planned = plan_deployment(tw, staged_cluster(tw), global_batch=6, budget_s=1, trials=1)
        assert isinstance(planned, StagedPlan)
        staged["planned_stages"] = (planned.plan, ("sgd",))
        # a rank running two stages, a micro-batched whole-model pipeline, GPipe
        layout = StageLayout(
            (0, units[3], units[4]), (Pipeline((0,), (0,), 4, 2), Pipeline((1, 2), (0, 1), 2, 2)), "gpipe"
        )
        staged["three_stages"] = (constructed(tw, 3, layout), ("adamw",))
        caps = [4 * small, small, small]
    files: dict[str, list[tuple[str, str]]] = {"ps": [], "staged": []}
    for kind, plans in (("ps", ps), ("staged", staged)):
        for name, (plan, optimizers) in plans.items():
            plan.save(out / f"{name}.json")
            files[kind] += [(str(out / f"{name}.json"), o) for o in optimizers]
    bn = None
    if world == 2:  # BatchNorm: the planner's split in equal micro-batches of 2
        x, y = U.dataset(4).tensors
        bn_workload = profile_model(
            H.batchnorm_net(), lambda: (x, y), torch.nn.CrossEntropyLoss(), batch_size=4, model_name="BN", repeats=2
        )
        bn_plan = plan_heterogeneous(bn_workload, spec, global_batch=6, budget_s=0.5, trials=1, micro_batch=2).plan
        bn_plan.save(out / "batchnorm.json")
        bn = str(out / "batchnorm.json")
    results = spawn(H.hetero, world, out, files["ps"], files["staged"], caps, STEPS, bn)
    for rank, r in enumerate(results):
        assert "error" not in r and "missing" not in r, (rank, [x.get("error", x) for x in results])
    return Runs(world, files["ps"], files["staged"], caps, results, planned)


def test_plans_mixing_ps_and_all_reduce_buckets_equal_one_process(runs: Runs) -> None:
    for rank, r in enumerate(runs.results):
        assert r["moved"] > 1e-3
        for path, optname in runs.ps:
            key = f"{Path(path).stem}/{optname}"
            assert r[key] < TOL, f"rank {rank} {key}: parameters differ from one process by {r[key]}"
        assert r["mixed_owner0/adamw/transports"] == ["collective", "ps"]
        assert r["mixed_owner0/adamw/servers"] == [0]
        if runs.world == 3:
            assert r["mixed_every_rank/sgd/servers"] is None
        else:
            assert r["dear_ps/adamw/transports"] == ["ps"]


def test_pipeline_stages_equal_one_process_on_the_global_batch(runs: Runs) -> None:
    for rank, r in enumerate(runs.results):
        for path, optname in runs.staged:
            key = f"{Path(path).stem}/{optname}"
            assert r[f"{key}/moved"] > 1e-3
            assert r[key] < TOL, f"rank {rank} {key}: parameters differ from one process by {r[key]}"


def test_a_closed_pipeline_releases_its_process_groups_and_trains_no_more(runs: Runs) -> None:
    for rank, r in enumerate(runs.results):
        for path, optname in runs.staged:
            key = f"{Path(path).stem}/{optname}"
            before, made, after = r[f"{key}/groups"]
            assert made > before and after == before, (rank, key, r[f"{key}/groups"])
            assert r[f"{key}/after_close"] == f"rank {rank}: this parallelized model was closed"


def test_each_rank_keeps_only_the_children_of_its_stages(runs: Runs) -> None:
    if runs.world == 2:
        assert runs.results[0]["two_stages_1f1b/sgd/owned"] == ["0", "1", "2"]
        assert runs.results[1]["two_stages_1f1b/sgd/owned"] == ["3", "4", "6"]
    else:
        assert runs.results[0]["three_stages/adamw/owned"] == ["0", "1", "2", "3", "4", "6"]
        assert runs.results[1]["three_stages/adamw/owned"] == ["0", "1", "2"]
        assert runs.results[2]["three_stages/adamw/owned"] == ["3", "4", "6"]


def test_a_model_over_the_small_devices_memory_trains_in_stages_where_data_parallelism_is_refused(runs: Runs) -> None:
    for rank, r in enumerate(runs.results):
        for path, optname in runs.staged:
            held = r[f"{Path(path).stem}/{optname}/held_bytes"]
            assert 0 < held <= runs.caps[rank]
        if runs.world == 2:
            continue  # data parallelism under the caps is tried on 3 ranks
        if runs.caps[rank] < max(runs.caps):
            assert r["dp_under_cap"].startswith(f"rank {rank} (small): the step held"), r["dp_under_cap"]
            assert "over its cap of" in r["dp_under_cap"]
        else:
            assert r["dp_under_cap"] == "fits"
    if runs.staged_plan is not None:
        plan = runs.staged_plan
        assert "rank 1 (small on node n1)" in plan.dp_refusal and "short by" in plan.dp_refusal
        assert [p.ranks for p in plan.layout.pipelines] == [(0,), (1, 2)]
        assert all(u <= c for u, c in zip(plan.used_bytes, plan.usable_bytes, strict=True))


def test_batchnorm_with_equal_micro_batches_and_uneven_counts_equals_one_process_on_those_micro_batches(
    runs: Runs,
) -> None:
    if runs.world != 2:
        pytest.skip("run on 2 ranks")
    for r in runs.results:
        sizes, micro = r["bn/sizes"]
        assert micro == 2 and all(b % 2 == 0 for b in sizes) and len(set(sizes)) == 2  # uneven counts
        assert r["bn/micro_batches"] < TOL
        # each rank's batch in one pass: BatchNorm's statistics over 2 and 4 samples, not the micro-batches'
        assert r["bn/one_pass"] > 1e5 * TOL


def test_a_dead_peer_ends_the_pipeline_with_a_clear_error_within_the_timeout(runs: Runs) -> None:
    if runs.world != 2:
        pytest.skip("run on 2 ranks")
    r = runs.results[0]
    assert r["dead_peer"].startswith("RuntimeCommError: pipeline 0 (rank 0 of its 2) failed, a peer may have"), r
    assert r["dead_peer_s"] < 25  # the plan's timeout_s=20, plus a margin
