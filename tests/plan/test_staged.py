"""Pipeline stages in the planner: optimal cuts under memory, used only where data parallelism does not fit."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from commsched import zoo
from commsched.cluster import Cluster, load_cluster
from commsched.plan.hetero import HeteroPlan
from commsched.plan.memory import GIB, InfeasibleError, MemoryModel, OutOfMemoryError
from commsched.plan.pipeline import LayerCosts, best_cuts, evaluate
from commsched.plan.staged import StagedPlan, plan_deployment
from commsched.schedule import CommPlan
from commsched.workload import Workload


def _mixed(small_gib: float, big_gib: float = 40.0) -> Cluster:
    """One fast device with room, four slow ones (two nodes of two)."""
    slow = {"name": "T4", "speed": 0.5, "memory_gib": small_gib}
    nic = {"bandwidth_gbps": 25, "latency_us": 2}
    nodes = [
        {
            "name": "big",
            "devices": [{"name": "A100", "speed": 2.0, "memory_gib": big_gib}],
            "nic": {**nic, "bandwidth_gbps": 100},
        },
        {"name": "s1", "count": 2, "device": slow, "nic": nic, "intra": {"bandwidth_gbps": 80, "latency_us": 2}},
        {"name": "s2", "count": 2, "device": slow, "nic": nic, "intra": {"bandwidth_gbps": 80, "latency_us": 2}},
    ]
    return Cluster.from_dict({"name": "mixed", "nodes": nodes})


def _bert_at(factor: float) -> tuple[Workload, Cluster]:
    """bert_large, 300 MB of activations per sample, on small devices it overflows ``factor`` times."""
    w = zoo.load("bert_large")
    w = w.model_copy(update={"extra": {**w.extra, "activation_bytes_per_sample": 300e6}})
    return w, _mixed(MemoryModel().bytes_for(w, 1) / factor / GIB)


def test_best_cuts_minimise_the_bottleneck_within_memory_as_brute_force_does() -> None:
    rng = random.Random(3)
    cluster = _mixed(1.0)
    ranks, speeds = [1, 2, 3], [2.0, 0.5, 0.5, 0.5, 0.5]
    for trial in range(20):
        n = 9
        costs = LayerCosts(
            tuple(rng.uniform(1, 5) * 1e8 for _ in range(n)),
            tuple(rng.uniform(0, 2) * 1e6 for _ in range(n)),
            tuple(rng.uniform(1, 10) * 1e-3 for _ in range(n)),
            tuple(range(n)),
        )
        usable = [rng.uniform(4, 9) * 1e8] * 5
        found = best_cuts(costs, cluster, ranks, usable, speeds, 2, 3)
        best = None
        for a, b in itertools.combinations(range(1, n), 2):
            chain = evaluate(costs, cluster, ranks, (0, a, b), usable, speeds, 2, 3)
            if chain is not None and (best is None or max(chain.stage_s) < best - 1e-15):
                best = max(chain.stage_s)
        if best is None:
            assert found is None, trial
        else:
            assert found is not None and max(found.stage_s) == pytest.approx(best, rel=1e-12), trial
            assert all(u <= c for u, c in zip(found.used_bytes, usable, strict=False))


def test_a_model_over_the_small_devices_memory_is_staged_where_data_parallelism_is_refused(tmp_path: Path) -> None:
    workload, cluster = _bert_at(1.5)
    with pytest.raises(OutOfMemoryError, match=r"rank 1 \(T4 on node s1\): one sample needs .* short by \d+\.\d\d GiB"):
        plan_deployment(workload, cluster, budget_s=1, trials=1, stages=False)
    with pytest.raises(InfeasibleError, match=r"memory_margin must be in \[0, 1\)"):  # not a memory problem: no stages
        plan_deployment(workload, cluster, memory_margin=1.5, budget_s=1, trials=1)
    plan = plan_deployment(workload, cluster, budget_s=1, trials=1)
    assert isinstance(plan, StagedPlan)
    assert "rank 1 (T4 on node s1)" in plan.dp_refusal and "short by" in plan.dp_refusal
    layout = plan.layout
    assert layout.global_batch == plan.global_batch == workload.batch_size * 5
    assert sorted(r for p in layout.pipelines for r in p.ranks) == [0, 1, 2, 3, 4]
    assert layout.pipelines[0].ranks == (0,) and max(p.depth for p in layout.pipelines) >= 2
    assert all(u <= c for u, c in zip(plan.used_bytes, plan.usable_bytes, strict=True))
    assert plan.iteration_ms == pytest.approx(max(plan.pipeline_ms) + plan.sync_ms)
    again = CommPlan.load(plan.save(tmp_path / "plan.json"))
    assert again.stages == layout and again.global_batch == plan.global_batch


def test_data_parallelism_is_kept_where_it_fits() -> None:
    hetero = plan_deployment(zoo.load("resnet18"), load_cluster("hetero-8"), budget_s=1, trials=1)
    assert isinstance(hetero, HeteroPlan) and hetero.plan.stages is None


def test_a_model_that_does_not_fit_even_in_stages_is_an_error_naming_the_total() -> None:
    workload, _ = _bert_at(1.0)
    tiny = _mixed(0.5, big_gib=0.5)
    with pytest.raises(InfeasibleError, match=r"does not fit even in pipeline stages over all 5 ranks of mixed"):
        plan_deployment(workload, tiny, budget_s=1, trials=1)
