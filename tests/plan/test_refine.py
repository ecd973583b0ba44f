"""The split's local search (``plan.refine``): its moves, local optima, the overlap cost it answers, the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched.bench.hetero_spec import MeasuredSpec, measured_spec
from commsched.cluster import Cluster
from commsched.plan.budget import Budget
from commsched.plan.hetero import plan_heterogeneous
from commsched.plan.refine import Refined, moves, refine_split
from commsched.plan.search import Candidate, simulate_candidate
from commsched.schedule import knobs as policy_knobs
from commsched.sim.options import SimOptions
from commsched.testbed.linkrate import LinkRate

ROOT = Path(__file__).resolve().parents[2]
SESSION10 = ROOT / "benchmarks" / "results" / "hetero-resnet5m" / "session10"


def _session10() -> MeasuredSpec:
    """The spec ``commsched bench --plan`` measured in session 10, rebuilt from its saved calibration."""
    report = json.loads((SESSION10 / "hetero.json").read_text())
    ranks = [json.loads((SESSION10 / "calibrate" / f"rank{r}.json").read_text()) for r in range(3)]
    links = [LinkRate(**link) for link in report["measured"]["links"]]
    return measured_spec(ranks, links, memory_gib=report["meta"]["config"]["memory_gib"] / 3)


SPEC = _session10()
WORKLOAD = SPEC.workload  # resnet5m, profiled on the testbed
OPTIONS = SimOptions(max_concurrent=2, cpu_per_task_ms=2.5, cpu_ms_per_mb=2.0, cpu_scales_with_speed=True)
SMALL_BUCKETS = {"bucket_cap_mb": 4.0, "first_bucket_mb": 1.0}


def test_moves_take_step_units_between_kinds_of_ranks_within_caps() -> None:
    kinds = ["a", "b", "b"]
    # ranks 1 and 2 are of one kind: one rank to one rank, and the kind's step from each of its ranks
    # (rank 0's one sample to the kind lands on one of them: the same split)
    assert moves((4, 2, 2), (8, 8, 8), kinds, 1) == [(3, 3, 2), (5, 1, 2), (6, 1, 1)]
    # a kind spreads over a kind evenly, smallest batches first (2 x 1 sample over three ranks); kind b
    # cannot give from every rank (two hold 1), but its largest batch can give one
    assert moves((2, 2, 1, 2, 1), (9,) * 5, ["a", "a", "b", "b", "b"], 1) == [
        (1, 2, 2, 2, 1),
        (1, 1, 2, 2, 2),
        (3, 2, 1, 1, 1),
    ]
    # distinct ranks: every ordered pair, but no rank below 1 and none above its cap
    assert sorted(moves((4, 2, 1), (8, 2, 8), ["a", "b", "c"], 1)) == [(3, 2, 2), (4, 1, 2), (5, 1, 1)]
    assert moves((4, 2, 2), (8, 8, 8), kinds, 2) == [(2, 4, 2), (2, 3, 3)]  # neither of ranks 1, 2 can give 2
    assert moves((1, 1), (1, 1), ["a", "b"], 1) == []
    assert moves((4, 2, 2), (8, 8, 8), ["a"] * 3, 1) == []  # one kind: nothing to move between


def _cluster(overlap_ms_per_mb: float | None) -> Cluster:
    """One full-speed worker and two at a quarter, 1 Gbit/s each; the slow ones pay ``overlap_ms_per_mb``."""
    nic = {"bandwidth_gbps": 1.0, "latency_us": 100.0}
    nodes: list[dict[str, object]] = [
        {"name": "fast", "count": 1, "device": {"name": "fast", "memory_gib": 8.0}, "nic": nic}
    ]
    for name in ("slow1", "slow2"):
        slow: dict[str, object] = {"name": "slow", "speed": 0.25, "memory_gib": 8.0}
        if overlap_ms_per_mb is not None:
            slow["overlap_ms_per_mb"] = overlap_ms_per_mb
        nodes.append({"name": name, "count": 1, "device": slow, "nic": nic})
    return Cluster.from_dict({"name": "one fast, two slow", "nodes": nodes})


def _candidate(cluster: Cluster, split: tuple[int, ...], knobs: dict[str, float]) -> Candidate:
    result = simulate_candidate(
        WORKLOAD, cluster, "ddp", knobs, batch_sizes=split, options=OPTIONS, iterations=4, warmup=2
    )
    return Candidate("ddp", {**policy_knobs("ddp"), **knobs}, "collective", 1, result, 4)


def _refine(cluster: Cluster, split: tuple[int, ...], budget_s: float = 60.0) -> Refined:
    return refine_split(
        WORKLOAD, cluster, _candidate(cluster, split, SMALL_BUCKETS), split, [64] * 3,
        options=OPTIONS, budget=Budget(budget_s), iterations=4, warmup=2,
    )  # fmt: skip


def test_the_refined_split_is_a_local_optimum_and_its_result_is_its_simulation() -> None:
    cluster = _cluster(20.0)
    start = (32, 8, 8)
    out = _refine(cluster, start)
    assert sum(out.split) == sum(start) and out.moves >= 1 and not out.exhausted
    assert out.candidate.iteration_ms < _candidate(cluster, start, SMALL_BUCKETS).iteration_ms
    again = simulate_candidate(
        WORKLOAD, cluster, "ddp", SMALL_BUCKETS, batch_sizes=out.split, options=OPTIONS, iterations=4, warmup=2
    )
    assert again.iteration_ms == pytest.approx(out.candidate.iteration_ms, rel=1e-12)
    for moved in moves(out.split, [64] * 3, [0, 1, 1], 1):
        near = simulate_candidate(
            WORKLOAD, cluster, "ddp", SMALL_BUCKETS, batch_sizes=moved, options=OPTIONS, iterations=4, warmup=2
        )
        assert near.iteration_ms >= out.candidate.iteration_ms - 1e-9, moved


def test_a_measured_overlap_cost_moves_samples_off_the_ranks_that_pay_it() -> None:
    # the same cluster with and without the slow workers' overlap cost: with it, they end with fewer samples
    free, costly = _refine(_cluster(None), (32, 8, 8)), _refine(_cluster(40.0), (32, 8, 8))
    assert costly.split[0] > free.split[0]
    assert costly.split[1] + costly.split[2] < free.split[1] + free.split[2]


def test_a_spent_budget_returns_the_start_and_says_so() -> None:
    cluster = _cluster(20.0)
    out = _refine(cluster, (32, 8, 8), budget_s=1e-9)
    assert out.split == (32, 8, 8) and out.exhausted and out.simulations == 0 and out.moves == 0


def test_on_a_measured_testbed_the_planner_refines_past_every_screened_split() -> None:
    # Session 10's measured spec (the quarter-core workers pay 16.2 and 9.2 ms per MiB all-reduced beside
    # compute): the screened splits' best was the proportional one with one bucket after backward; moving
    # samples off the slow workers lets overlapping buckets pay off.
    plan = plan_heterogeneous(
        SPEC.workload, SPEC.cluster, global_batch=48, budget_s=30, sim_options=SPEC.options(),
        policies=["ddp", "mgwfbp", "wfbp"],
    )  # fmt: skip
    assert any(n.startswith("split refined by local search") for n in plan.notes), plan.notes
    proportional = plan.baseline("proportional_allreduce")
    assert plan.batch_sizes != proportional.batch_sizes
    assert plan.iteration_ms < 0.97 * proportional.iteration_ms
    assert plan.batch_sizes[1] < proportional.batch_sizes[1]  # the worker paying most for overlap gives samples
