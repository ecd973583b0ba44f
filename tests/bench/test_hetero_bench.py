"""``commsched bench --plan`` without a testbed: the measured spec, the configurations' data, the summary, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from commsched import zoo
from commsched.bench.hetero import HeteroBenchConfig, batch_sizes, predictions, summarise
from commsched.bench.hetero_report import markdown, targets
from commsched.bench.hetero_spec import measured_spec
from commsched.bench.hetero_worker import HeteroJob, local_batches, order
from commsched.cli import cli
from commsched.cli.bench_plan import parse_cpu
from commsched.errors import SpecError
from commsched.formulas import ring_all_reduce_s
from commsched.models import synthetic_batch
from commsched.plan.hetero import plan_heterogeneous
from commsched.testbed.linkrate import LinkRate, probe_mib

_ALPHA_S, _MBIT_S = 200e-6, 8000.0


def _rank(workload: Any, slowdown: float, with_samples: bool) -> dict[str, Any]:
    data = json.loads(workload.to_json())
    for layer in data["layers"]:
        layer["forward_ms"] *= slowdown
        layer["backward_ms"] *= slowdown
    out: dict[str, Any] = {"workload": data, "update_ms": 2.0 * slowdown}
    if with_samples:  # an exact ring all-reduce at α, β: the fit must give them back
        beta = 1 / (_MBIT_S * 1e6 / 8)
        sizes = [2**14, 2**16, 2**18, 2**20]
        out["samples"] = [
            {"op": "all_reduce", "nbytes": n, "world_size": 3, "seconds": [ring_all_reduce_s(n, 3, _ALPHA_S, 1 / beta)]}
            for n in sizes
        ]
    return out


def _spec(slowdowns: tuple[float, ...] = (1.0, 4.0, 4.0), rates: tuple[float, ...] = (27000.0, 9000.0, 9000.0)) -> Any:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, s, r == 0) for r, s in enumerate(slowdowns)]
    links = [LinkRate(r, rate, 0.05, 8.0) for r, rate in enumerate(rates)]
    return measured_spec(ranks, links, memory_gib=8.0)


def test_the_measured_spec_takes_speeds_from_the_profiles_and_nics_from_the_link_probes() -> None:
    spec = _spec()
    assert spec.speeds == pytest.approx((1.0, 0.25, 0.25), rel=1e-6)
    assert [n.nic.bandwidth_gbps for n in spec.cluster.nodes] == pytest.approx([27.0, 9.0, 9.0])
    assert spec.alpha_s == pytest.approx(_ALPHA_S, rel=1e-6)
    assert spec.allreduce_mbit_s == pytest.approx(_MBIT_S, rel=1e-6)
    assert spec.update_ms == 2.0 and spec.workload.model == "resnet18"
    assert {f"update_ms={2.0:.4g}", "algorithm=ring", "cpu_scales_with_speed=true"} <= set(spec.sim_pairs())
    assert spec.cluster.worker_batch_curves("resnet18") == ((), (), ())  # no batch_ms measured


def test_the_ranks_timings_at_several_batches_become_their_devices_batch_curves() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, s, r == 0) for r, s in enumerate((1.0, 4.0))]
    ranks[1]["batch_ms"] = {"16": 2800.0, "8": 1500.0, "32": 5500.0}  # JSON keys
    spec = measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)
    assert spec.cluster.worker_batch_curves("resnet18") == ((), ((8, 1500.0), (16, 2800.0), (32, 5500.0)))
    assert spec.options().cpu_scales_with_speed


def test_where_every_rank_timed_the_profile_batch_the_curves_set_the_speeds_and_the_workloads_level() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, s, r == 0) for r, s in enumerate((1.0, 4.0))]
    profiled = workload.forward_ms + workload.backward_ms
    level = 1.1 * profiled  # the rounds of the curve: rank 0 10 % slower than its layer profile said
    b = workload.batch_size
    ranks[0]["batch_ms"] = {str(b // 2): level / 2, str(b): level, str(2 * b): 2 * level}
    ranks[1]["batch_ms"] = {str(b // 2): 2.5 * level, str(b): 5 * level, str(2 * b): 10 * level}  # 1 : 5, not 1 : 4
    links = [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)]
    spec = measured_spec(ranks, links, memory_gib=1.0)
    assert spec.rank_compute_ms == pytest.approx((level, 5 * level))
    assert spec.speeds == pytest.approx((1.0, 0.2))
    assert spec.workload.forward_ms + spec.workload.backward_ms == pytest.approx(level)
    shares = [layer.forward_ms / workload.forward_ms for layer in workload.layers]
    assert [layer.forward_ms / spec.workload.forward_ms for layer in spec.workload.layers] == pytest.approx(shares)
    del ranks[1]["batch_ms"][str(b)]  # a curve without the profile's batch: the profiles set both, as before
    spec = measured_spec(ranks, links, memory_gib=1.0)
    assert spec.speeds == pytest.approx((1.0, 0.25)) and spec.workload == workload


def test_a_spec_from_ranks_that_profiled_different_batches_is_refused() -> None:
    workload = zoo.load("resnet18")
    other = workload.model_copy(update={"batch_size": 8})
    ranks = [_rank(workload, 1.0, True), _rank(other, 1.0, False)]
    with pytest.raises(SpecError, match=r"ranks\[1\]: profiled resnet18 at batch 8"):
        measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)


def test_the_plan_on_the_measured_spec_balances_compute_and_is_predicted_faster_than_even_dp() -> None:
    spec = _spec()
    plan = plan_heterogeneous(
        spec.workload, spec.cluster, global_batch=192, budget_s=1, trials=1, sim_options=spec.options()
    )
    sizes = batch_sizes(spec, plan.plan, 192)
    assert sizes["even_ddp"] == [64, 64, 64] and sizes["proportional_dp"] == [128, 32, 32]  # ∝ speed (4 : 1 : 1)
    assert sum(sizes["plan"]) == 192 and sizes["plan"][0] > sizes["plan"][1]
    assert sizes["plan_compute"] == sizes["plan"]
    predicted, trace = predictions(spec, plan.plan, sizes)
    assert predicted["plan"] == pytest.approx(plan.iteration_ms, rel=0.05)
    assert predicted["plan"] < predicted["even_ddp"] / 1.5  # compute-bound: close to the ideal 2x
    assert 0 < predicted["plan_compute"] <= predicted["plan"]  # compute alone: the plan without communication
    assert trace is not None and {e.worker for e in trace.events} == {0, 1}  # per worker class: 1 and 2 are one
    assert trace.meta["classes"] == [[0], [1, 2]]
    assert {"forward", "backward"} < {e.kind for e in trace.events} and any(e.bytes for e in trace.events)


def test_the_summary_pairs_speedups_by_repeat_and_sets_predictions_beside() -> None:
    def run(name: str, repeat: int, step_s: float) -> dict[str, Any]:
        return {"name": name, "repeat": repeat, "starts_s": [i * step_s for i in range(5)], "times_s": [step_s] * 5}

    ms = {("even_ddp", 0): 0.4, ("plan", 0): 0.2, ("even_ddp", 1): 0.6, ("plan", 1): 0.25}
    ms |= {("plan_compute", 0): 0.1, ("plan_compute", 1): 0.12}
    rank0 = {"runs": [run(n, k, s) | {"max_param_diff": 1e-7} for (n, k), s in ms.items()]}
    rank1 = {"runs": [run(n, k, s * 0.5) for (n, k), s in ms.items()]}  # never the slowest
    summary = summarise([rank0, rank1], warmup=2, predicted={"plan": 250.0, "plan_compute": 55.0})
    assert summary["plan"]["median_ms"] == pytest.approx(225.0)
    assert summary["plan"]["speedup_vs_even_ddp"] == pytest.approx((2.0 + 2.4) / 2)  # paired, not 500/225
    assert summary["plan"]["error_pct"] == pytest.approx((250 - 225) / 225 * 100)
    reference = summary["plan_compute"]  # measured and predicted, but no speed-up: nothing one could run
    assert reference["median_ms"] == pytest.approx(110.0) and reference["error_pct"] == pytest.approx(-50.0)
    assert not {"speedup_vs_even_ddp", "max_param_diff"} & set(reference)
    sizes = {"even_ddp": [2, 2], "plan": [3, 1], "plan_compute": [3, 1]}
    report = {"summary": summary, "batch_sizes": sizes}
    assert "| plan | 3 1 | 250 | 225 |" in markdown(report)
    assert "| plan's compute alone (reference) | 3 1 | 55 | 110 |" in markdown(report)
    assert [met for _, met in targets(report)] == [True, True]  # the reference's -50 % is no target's


def test_every_configuration_trains_on_the_same_global_batches() -> None:
    sizes = {"even_ddp": [2, 2, 2], "plan": [4, 1, 1]}
    job = HeteroJob(out="", model="cnn", batch_sizes=sizes, plan_path="", iters=1, warmup=3, repeats=1)
    for config in sizes:
        parts = [local_batches(job, config, r) for r in range(3)]
        assert [len(parts[r][0][0]) for r in range(3)] == sizes[config]
        for step in range(job.steps):
            joined = torch.cat([parts[r][step][0] for r in range(3)])
            assert torch.equal(joined, synthetic_batch("cnn", 6, 0, 0, step)[0])
    assert order(["a", "b", "c"], 1) == ["b", "c", "a"]


def test_cpu_shares_and_bad_options_are_refused_clearly(tmp_path: Path) -> None:
    shares = parse_cpu("0@100,1@25,1+2@50")
    assert [s.cpus for s in shares] == [(0,), (1,), (1, 2)] and [s.quota for s in shares] == [1.0, 0.25, 0.5]
    with pytest.raises(ValueError, match=r"entry 1 \('x@25'\)"):
        parse_cpu("0@100,x@25")
    with pytest.raises(ValueError, match="warmup"):
        HeteroBenchConfig(warmup=1)
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "--plan", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "no such plan file" in result.output
    result = runner.invoke(cli, ["bench", "--plan", "auto", "--worker-cpu", "0@100,1@0.1"])
    assert result.exit_code == 2 and "--worker-cpu" in result.output and "quota" in result.output
    assert probe_mib(None) == 64 and probe_mib(10**8) == pytest.approx(10**8 / 8 / 2**20)


def test_a_batch_curve_takes_each_batchs_time_relative_to_the_reference_in_the_same_round() -> None:
    from commsched.bench.batch_curve import curve_points

    drifting = {8: [150.0, 100.0, 75.0], 16: [300.0, 200.0, 150.0], 32: [600.0, 450.0, 300.0]}  # the machine speeds up
    points = curve_points(drifting, 16)
    assert points == pytest.approx({8: 100.0, 16: 200.0, 32: 400.0})  # ratios 0.5 and 2.0 in (nearly) every round
    assert curve_points(drifting, 4) == {8: 100.0, 16: 200.0, 32: 450.0}  # no reference: the medians


def test_each_ranks_batch_curve_is_timed_around_its_speed_proportional_share() -> None:
    from commsched.bench.batch_curve import batches_around_shares

    # 48 samples over speeds 1 : 0.25 : 0.25 -> shares 32, 8, 8; the profile's batch 16 stays (the reference)
    slow = [6, 8, 10, 16]
    assert batches_around_shares(16, [600.0, 2400.0, 2400.0], 48) == [[16, 24, 32, 40], slow, slow]
    # rounding merges points: fractions further out, then the smallest unused batches, keep the count equal
    assert batches_around_shares(2, [10.0, 10.0, 10.0], 6) == [[1, 2, 3, 4]] * 3
    assert batches_around_shares(1, [10.0], 1) == [[1, 2, 3, 4]]
    with pytest.raises(ValueError, match="> 0 ms"):
        batches_around_shares(16, [600.0, 0.0], 48)
    with pytest.raises(ValueError, match="global_batch"):
        batches_around_shares(16, [600.0], 0)
