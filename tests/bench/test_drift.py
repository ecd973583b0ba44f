"""The host's speed during a session: speed factors from the references, the spec rescaled, predictions at run speed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from commsched import zoo
from commsched.bench.batch_curve import time_batch_curve
from commsched.bench.drift import factors_by_batch, speed_factors
from commsched.bench.hetero import batch_sizes, predictions, predictions_at_run_speed, summarise
from commsched.bench.hetero_report import AT_RUN_COLUMNS, markdown, targets
from commsched.bench.hetero_spec import MeasuredSpec, measured_spec
from commsched.plan.hetero import plan_heterogeneous
from commsched.testbed.linkrate import LinkRate


def _spec() -> MeasuredSpec:
    workload = zoo.load("resnet18")
    b = workload.batch_size
    ranks: list[dict[str, Any]] = []
    for slowdown in (1.0, 4.0, 4.0):
        ranks.append({"workload": json.loads(workload.to_json()), "update_ms": 2.0})
        level = 100.0 * slowdown
        ranks[-1]["batch_ms"] = {str(b // 2): 0.55 * level, str(b): level, str(2 * b): 1.9 * level}
    ranks[0]["samples"] = [
        {"op": "all_reduce", "nbytes": n, "world_size": 3, "seconds": [2e-4 + n / 1e9]} for n in (2**14, 2**18, 2**22)
    ]
    links = [LinkRate(r, rate, 0.05, 8.0) for r, rate in enumerate((27000.0, 9000.0, 9000.0))]
    return measured_spec(ranks, links, memory_gib=8.0)


def test_a_ranks_speed_factor_is_its_median_reference_over_its_calibrated_time_per_repeat() -> None:
    references = [
        [{"repeat": 0, "ms": [100.0, 130.0, 110.0]}, {"repeat": 1, "ms": [90.0, 95.0, 500.0]}],
        [{"repeat": 1, "ms": [420.0, 400.0, 410.0]}, {"repeat": 0, "ms": [380.0, 400.0, 390.0]}],
    ]
    first, second = speed_factors(references, [100.0, 400.0])  # repeats in order, ranks in order
    assert first == pytest.approx([1.1, 0.975]) and second == pytest.approx([0.95, 1.025])
    with pytest.raises(ValueError, match=r"references\[1\]: repeat 1 needs one record"):
        speed_factors([references[0], references[1][1:]], [100.0, 400.0])
    with pytest.raises(ValueError, match=r"references\[0\]: repeat 0 .* got \[\[0.0\]\]"):
        speed_factors([[{"repeat": 0, "ms": [0.0]}], [{"repeat": 0, "ms": [1.0]}]], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"calibrated_ms\[1\]: must be > 0, got 0.0"):
        speed_factors(references, [100.0, 0.0])
    assert speed_factors([[], []], [1.0, 1.0]) == []  # a session without references: no factors


def test_the_rescaled_spec_slows_each_ranks_compute_by_its_factor_and_nothing_else() -> None:
    spec = _spec()
    slower = spec.rescaled([1.2, 1.0, 0.5])
    assert slower.speeds == pytest.approx([s / f for s, f in zip(spec.speeds, (1.2, 1.0, 0.5), strict=True)])
    assert slower.rank_compute_ms == pytest.approx([120.0, 400.0, 200.0])
    model = spec.workload.model
    before, after = spec.cluster.worker_batch_curves(model), slower.cluster.worker_batch_curves(model)
    assert [b for c in after for b, _ in c] == [b for c in before for b, _ in c]
    assert [ms for c in after for _, ms in c] == pytest.approx(
        [ms * f for c, f in zip(before, (1.2, 1.0, 0.5), strict=True) for _, ms in c]
    )
    assert [n.nic for n in slower.cluster.nodes] == [n.nic for n in spec.cluster.nodes]
    assert slower.workload == spec.workload and slower.update_ms == spec.update_ms
    assert spec.rescaled([1.0, 1.0, 1.0]).cluster.worker_speeds(model) == spec.cluster.worker_speeds(model)
    with pytest.raises(ValueError, match=r"factors\[1\]: a number > 0, or one per batch .* got -1.0"):
        spec.rescaled([1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="factors"):
        spec.rescaled([1.0, 1.0])


def test_factors_per_batch_take_each_batch_over_the_reference_round_by_round_against_the_calibration() -> None:
    references = [
        # rank 0 timed batch 36 beside 16: per round 2.0, 2.2, 2.1 times the reference, whose median is 100
        [{"repeat": 0, "batch": 16, "ms": [100.0, 90.0, 110.0], "at": {"36": [200.0, 198.0, 231.0]}}],
        [{"repeat": 0, "batch": 16, "ms": [400.0, 420.0, 380.0]}],  # its plan's batch was the reference's
    ]

    def calibrated(rank: int, batch: int) -> float:
        return {(0, 16): 100.0, (0, 36): 200.0, (1, 16): 400.0}[rank, batch]

    assert factors_by_batch(references, calibrated) == [[{16: 1.0, 36: pytest.approx(1.05)}, {16: 1.0}]]
    # the reference's own factor is speed_factors' figure
    assert speed_factors(references, [100.0, 400.0]) == [[1.0, 1.0]]
    short = [[{**references[0][0], "at": {"36": [200.0]}}], references[1]]
    with pytest.raises(ValueError, match=r"references\[0\]: repeat 0, batch 36 needs one time > 0 ms per round"):
        factors_by_batch(short, calibrated)
    with pytest.raises(ValueError, match=r"references\[1\]: repeat 0 needs one record, got 0"):
        factors_by_batch([references[0], []], calibrated)


def test_a_factor_per_batch_is_exact_at_its_batches_and_at_those_simulated_and_linear_between() -> None:
    spec = _spec()
    b = spec.workload.batch_size
    assert spec.compute_ms_at(1, b) == pytest.approx(400.0) and spec.compute_ms_at(1, 2 * b) == pytest.approx(760.0)
    one = spec.rescaled([{b: 1.2}, 1.0, {b: 0.5}])
    assert one.cluster == spec.rescaled([1.2, 1.0, 0.5]).cluster  # a single factor: as a number
    wanted = [b // 4, b // 2, b, 3 * b // 2, 2 * b, 3 * b]
    slower = spec.rescaled([{b: 1.0, 2 * b: 1.2}, {b // 2: 0.9, b: 1.1}, 1.0], wanted)
    ratios = [[slower.compute_ms_at(r, x) / spec.compute_ms_at(r, x) for x in wanted] for r in range(3)]
    assert ratios[0] == pytest.approx([1.0, 1.0, 1.0, 1.1, 1.2, 1.2])  # the nearest factor beyond the ends
    assert ratios[1] == pytest.approx([0.9, 0.9, 1.1, 1.1, 1.1, 1.1])
    assert ratios[2] == pytest.approx([1.0] * 6)
    assert slower.rank_compute_ms == pytest.approx([100.0, 440.0, 400.0])
    with pytest.raises(ValueError, match=rf"factors\[0\]: .* including the profile's batch {b}, got \{{8: 1.0\}}"):
        spec.rescaled([{8: 1.0}, 1.0, 1.0])


def test_a_batch_curve_times_each_batch_once() -> None:
    with pytest.raises(ValueError, match=r"batches: each batch once, got \[8, 8\]"):
        time_batch_curve("cnn", [8, 8], 0, 0, None)  # type: ignore[arg-type]  # refused before any use


def test_predictions_at_run_speed_are_the_median_over_repeats_and_follow_the_slowest_ranks_factor() -> None:
    spec = _spec()
    plan = plan_heterogeneous(
        spec.workload, spec.cluster, global_batch=96, budget_s=1, trials=1, sim_options=spec.options()
    )
    sizes = batch_sizes(spec, plan.plan, 96)

    def predict(s: MeasuredSpec, p: Any, z: dict[str, list[int]]) -> dict[str, float]:
        return predictions(s, p, z, trace=False)[0]

    at_calibration = predict(spec, plan.plan, sizes)
    assert predictions_at_run_speed(spec, plan.plan, sizes, [[1.0] * 3]) == pytest.approx(at_calibration)
    assert predictions_at_run_speed(spec, plan.plan, sizes, []) == {}
    factors = [[1.3] * 3, [1.1] * 3, [1.2] * 3]  # the host 20 % slower in the median repeat, on every rank
    at_run = predictions_at_run_speed(spec, plan.plan, sizes, factors)
    assert at_run == pytest.approx(predict(spec.rescaled([1.2] * 3), plan.plan, sizes))
    compute = at_run["plan_compute"] / at_calibration["plan_compute"]  # compute alone grows by the factor
    assert 1.15 < compute <= 1.2 + 1e-9, compute  # (less the optimizer step, which the factor leaves alone)
    assert at_run["even_ddp"] > at_calibration["even_ddp"]
    # a factor per batch: rank 0 slower at its plan's batch only; even DP's batch lies below the profile's,
    # where its factor is the profile batch's
    b, top = spec.workload.batch_size, sizes["plan"][0]
    assert sizes["even_ddp"][0] < b < top
    by_batch = predictions_at_run_speed(spec, plan.plan, sizes, [[{b: 1.0, top: 1.3}, 1.0, 1.0]])
    assert by_batch["even_ddp"] == pytest.approx(at_calibration["even_ddp"])
    assert by_batch["plan_compute"] > at_calibration["plan_compute"]


def test_the_report_sets_the_prediction_at_run_speed_beside_and_checks_both_errors() -> None:
    def run(name: str, step_s: float) -> dict[str, Any]:
        return {"name": name, "repeat": 0, "starts_s": [i * step_s for i in range(4)], "times_s": [step_s] * 4}

    files = [{"runs": [run("even_ddp", 0.4), run("plan", 0.2), run("plan_compute", 0.1)]}]
    predicted = {"even_ddp": 380.0, "plan": 150.0, "plan_compute": 70.0}
    at_run = {"even_ddp": 410.0, "plan": 190.0, "plan_compute": 95.0}
    summary = summarise(files, warmup=1, predicted=predicted, at_run_speed=at_run)
    assert summary["plan"]["error_pct"] == pytest.approx(-25.0)
    assert summary["plan"]["error_at_run_pct"] == pytest.approx(-5.0)
    report = {"summary": summary, "batch_sizes": {"even_ddp": [2, 2], "plan": [3, 1], "plan_compute": [3, 1]}}
    table = markdown(report)
    assert (
        all(c in table for c in AT_RUN_COLUMNS)
        and "| plan | 3 1 | 150 | 200 | 200–200 | -25.0 % | 190 | -5.0 % |" in table
    )
    lines = dict(targets(report))
    assert lines == {
        "plan 2.00× even DP (target ≥ 1.6×)": True,
        "largest prediction error at the runs' compute speed -5.0 % (plan; target within ±15 %)": True,
        "largest prediction error at the calibration's -25.0 % (plan; target within ±15 %)": False,
    }
    old = {"summary": summarise(files, warmup=1, predicted=predicted), "batch_sizes": report["batch_sizes"]}
    assert not any(c in markdown(old) for c in AT_RUN_COLUMNS)  # reports from before: the table as it was
    assert [text for text, _ in targets(old)][1:] == [
        "largest prediction error at the calibration's -25.0 % (plan; target within ±15 %)"
    ]
