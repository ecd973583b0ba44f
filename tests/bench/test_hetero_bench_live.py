"""``commsched bench --plan auto`` for real, at the smallest scale: 3 workers of different CPU share and link rate.

Root only (namespaces, tc, cgroups); skipped otherwise, with the reason.
The model has no BatchNorm, so every configuration trains on the same
global batches to the same parameters (float32 summation order aside).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from commsched.bench.batch_curve import batches_around_shares, proportional_share
from commsched.bench.hetero import HeteroBenchConfig, run_hetero_bench
from commsched.bench.overlap import OVERLAP_REPEATS, OVERLAP_VOLUME, OverlapTimes
from commsched.bench.task_overlap import TaskOverlap, fit_costs, layouts
from commsched.cluster import load_cluster
from commsched.schedule import CommPlan
from commsched.testbed import CpuShare, LinkShape, cgroup_objects, cgroups_unavailable_reason, netns_unavailable_reason
from commsched.testbed.commands import PREFIX
from commsched.trace import Trace

_REASON = cgroups_unavailable_reason() or netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.multiproc,
    pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}"),
]


def test_bench_plan_auto_measures_the_testbed_plans_on_it_and_runs_plan_and_baselines(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: A alone on one, B and C on the other")
    config = HeteroBenchConfig(
        model="transformer",
        # B and C share the second core without a quota (about half each while both compute), so that they
        # start (import torch) in seconds; quotas themselves are checked by tests/testbed/test_cgroups_live.py
        cpu=(CpuShare(cpus=(cores[0],)), CpuShare(cpus=(cores[1],)), CpuShare(cpus=(cores[1],))),
        links=(LinkShape(rate_bps=10**9), LinkShape(rate_bps=3 * 10**8), LinkShape(rate_bps=3 * 10**8)),
        global_batch=6,
        iters=1,
        warmup=3,
        repeats=1,
        budget_s=1.0,
        comm_timeout_s=30.0,
    )
    report = run_hetero_bench(config, tmp_path, log=lambda _: None)
    measured = report["measured"]
    rates = [link["throughput_mbit_s"] for link in measured["links"]]
    assert rates[0] > 2 * rates[1] and 150 < rates[1] < 310, rates  # 1 Gbit/s vs 300 Mbit/s, TCP goodput
    # B and C compute on one shared core; they overlap for part of each profile only (0.5 would be full overlap,
    # 0.73-0.80 was read on a loaded host), so anything clearly below A's alone-on-its-core speed passes
    assert measured["speeds"][0] == 1.0 and max(measured["speeds"][1:]) < 0.9, measured["speeds"]
    curves = [sorted(c) for c in measured["batch_ms"]]  # each rank's, around its share of 6 and at the profile's 2
    ranks = [json.loads((tmp_path / "calibrate" / f"rank{r}.json").read_text()) for r in range(3)]
    profiled = [r["workload"]["extra"]["iteration_ms"] for r in ranks]  # what the ranks chose their batches from
    assert curves == batches_around_shares(2, profiled, 6), (curves, profiled)
    assert all(len(c) == 4 and 2 in c for c in curves), curves
    # each rank timed its backward alone and beside an all-reduce of every gradient; the spec took the cost
    overlaps = [OverlapTimes.from_dict(r["overlap"], f"rank {r['rank']}") for r in ranks]
    numel = report["meta"]["model_parameters"]
    volume = OVERLAP_VOLUME * 4 * numel
    assert all(len(t.backward_beside_ms) == OVERLAP_REPEATS and t.nbytes == volume for t in overlaps)
    spec = load_cluster(measured["files"]["cluster"])
    assert measured["overlap_ms_per_mb"] == list(spec.worker_overlap_ms_per_mb())
    assert all(c is not None and c >= 0 for c in measured["overlap_ms_per_mb"]), measured["overlap_ms_per_mb"]
    assert measured["overlap_comm_rate"] == list(spec.worker_overlap_comm_rate())
    # and beside the runtime's own tasks in three bucket layouts, at each rank's proportional share, round by
    # round; the spec took both costs from them
    assert [r["task_overlap_batch"] for r in ranks] == [proportional_share(profiled, 6, r) for r in range(3)]
    timed = [[TaskOverlap.from_dict(r[key], f"rank {r['rank']}") for key in layouts(1.0)] for r in ranks]
    assert all(len(t.beside_ms) == OVERLAP_REPEATS for per_rank in timed for t in per_rank)
    assert measured["overlap_ms_per_task"] == list(spec.worker_overlap_ms_per_task())
    fitted = [fit_costs(*per_rank) for per_rank in timed]
    assert measured["overlap_ms_per_task"] == [t for t, _ in fitted]
    assert measured["overlap_ms_per_mb"] == [m for _, m in fitted]
    assert all(0 < rate <= 1 for rate in measured["overlap_comm_rate"] if rate is not None)
    sizes = report["batch_sizes"]
    assert sizes["even_ddp"] == [2, 2, 2] and sum(sizes["plan"]) == 6 and sum(sizes["proportional_dp"]) == 6
    assert CommPlan.load(tmp_path / "plan.json").batch_sizes == tuple(sizes["plan"])
    assert "commsched plan -m measured/workload.json -c measured/cluster.yaml" in report["plan"]["command"]
    summary = report["summary"]
    for name in ("even_ddp", "proportional_dp", "plan"):
        row = summary[name]
        assert row["median_ms"] > 0 and row["predicted_ms"] > 0, (name, row)
        assert row["max_param_diff"] < 1e-4, (name, row)  # same global batches: the same training
    compute = summary["plan_compute"]  # the plan's compute alone, beside what the simulator gave the slowest rank
    assert compute["median_ms"] > 0 and 0 < compute["predicted_ms"] <= summary["plan"]["predicted_ms"], compute
    # the repeat began with every rank's reference at the profile's batch: the speed factors and, beside each
    # prediction, the same at the runs' speed
    session = [json.loads((tmp_path / "session" / f"rank{r}.json").read_text()) for r in range(3)]
    assert all(len(f["reference"]) == 1 and f["reference"][0]["batch"] == 2 for f in session), session[0]["reference"]
    (factors,) = measured["speed_factors"]
    assert factors == [
        sorted(f["reference"][0]["ms"])[len(f["reference"][0]["ms"]) // 2] / ms
        for f, ms in zip(session, measured["rank_compute_ms"], strict=True)
    ]
    # and, in the same rounds, its batch in the plan: a factor per batch where the two differ
    (by_batch,) = measured["speed_factors_by_batch"]
    for f, plan_batch, per_batch, factor in zip(session, sizes["plan"], by_batch, factors, strict=True):
        record = f["reference"][0]
        assert per_batch["2"] == pytest.approx(factor)
        if plan_batch == 2:
            assert "at" not in record and list(per_batch) == ["2"], (record, per_batch)
        else:
            assert len(record["at"][str(plan_batch)]) == len(record["ms"]) and set(per_batch) == {"2", str(plan_batch)}
    for row in summary.values():
        assert row["predicted_at_run_ms"] > 0 and "error_at_run_pct" in row, row
    assert report["traces"] == {
        "plan": "trace-plan.json",
        "proportional_dp": "trace-proportional_dp.json",
        "plan (predicted)": "trace-plan-predicted.json",
    }
    measured_trace = Trace.load(tmp_path / "trace-plan.json")
    assert {e.worker for e in measured_trace.events} == {0, 1, 2}, "every rank's trace of the plan"
    assert not list((tmp_path / "session" / "traces").glob("*.json"))  # merged, the parts removed
    assert (tmp_path / "hetero.json").is_file() and (tmp_path / "measured" / "cluster.yaml").is_file()
    assert cgroup_objects(PREFIX + str(os.getpid())) == []
