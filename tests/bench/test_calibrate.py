"""``bench --validate`` without processes: from a calibration to predicted-vs-measured rows and tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from commsched import zoo
from commsched.bench.baselines import DDP_GRID, YARDSTICK
from commsched.bench.calibrate import Calibration, load_calibration, predict_session, revalidate, save_inputs
from commsched.bench.report import validation_markdown, validation_table
from commsched.bench.validate import predict
from commsched.cluster import Cluster
from commsched.formulas import ring_all_reduce_s
from commsched.profile.probe_fit import ProbeSample, fit_alpha_beta
from commsched.workload import Workload

ALPHA_S, BETA = 300e-6, 8 / 300e6  # 300 µs per ring step, 300 Mbit/s


def _calibration_data() -> dict[str, Any]:
    workload = zoo.load("resnet18")
    samples = [
        {"op": "all_reduce", "nbytes": n, "world_size": 4, "seconds": [ring_all_reduce_s(n, 4, ALPHA_S, 1 / BETA)] * 3}
        for n in (2**16, 2**20, 2**24)
    ]
    return {
        "rank": 0,
        "world": 4,
        "alpha_s": ALPHA_S,
        "beta_s_per_byte": BETA,
        "samples": samples,
        "workload": json.loads(workload.to_json()),
        "update_ms": 7.0,
    }


def _session(measured: dict[str, float]) -> dict[str, Any]:
    return {"label": "300mbit", "summary": {name: {"median_ms": ms} for name, ms in measured.items()}}


def test_every_policy_and_reference_is_predicted_by_the_simulator_with_the_calibrated_inputs() -> None:
    cal = Calibration(_calibration_data(), "test")
    measured = {"torch_ddp": 900.0, "dear": 700.0, YARDSTICK: 800.0, "compute": 500.0, "allreduce": 400.0}
    out = predict_session(_session(measured), cal, ["torch_ddp", "dear"], {"dear": {"threshold_mb": 4.0}})
    rows = out["rows"]
    assert set(rows) == {"torch_ddp", "dear", YARDSTICK, "compute", "allreduce"}
    fitted = cal.fitted(400.0, 500.0)  # the bandwidth and the compute fitted to the references
    w, cluster = fitted.workload, fitted.cluster
    # torch_ddp is DDP's initial bucketing (find_unused_parameters=True), the yardstick the same with
    # 1 MiB buckets; knobs reach the policy
    initial = {"rebuilt": False}
    assert (
        rows["torch_ddp"]["predicted_ms"] == predict(w, cluster, ["ddp"], knobs={"ddp": initial}, update_ms=7.0)["ddp"]
    )
    one_mib = predict(w, cluster, ["ddp"], knobs={"ddp": {**initial, "bucket_cap_mb": 1.0}}, update_ms=7.0)["ddp"]
    assert rows[YARDSTICK]["predicted_ms"] == one_mib != rows["torch_ddp"]["predicted_ms"]
    dear4 = predict(w, cluster, ["dear"], knobs={"dear": {"threshold_mb": 4.0}}, update_ms=7.0)["dear"]
    assert rows["dear"]["predicted_ms"] == dear4 != predict(w, cluster, ["dear"], update_ms=7.0)["dear"]
    profiled = cal.workload.forward_ms + cal.workload.backward_ms
    assert rows["compute"]["predicted_ms"] == pytest.approx(profiled + 7.0)  # the profile's own prediction, a check
    all_reduce_ms = ring_all_reduce_s(w.total_bytes, 4, ALPHA_S, 1 / BETA) * 1e3
    assert rows["allreduce"]["predicted_ms"] == pytest.approx(all_reduce_ms)  # the probe's own prediction, a check
    for name, row in rows.items():
        assert row["measured_ms"] == measured[name]
        assert row["error_pct"] == pytest.approx((row["predicted_ms"] - measured[name]) / measured[name] * 100)
    # the summary error covers the policies only, not the references
    policy_errors = sorted(abs(rows[p]["error_pct"]) for p in ("torch_ddp", "dear"))
    assert out["median_abs_error_pct"] == pytest.approx(sum(policy_errors) / 2)
    assert out["calibration"]["probe_bandwidth_mbit_s"] == pytest.approx(300.0)
    assert out["calibration"]["bandwidth_mbit_s"] == pytest.approx(8 / cal.fitted(400.0).beta_s_per_byte / 1e6)


def test_the_bandwidth_is_fitted_to_the_reference_all_reduce_and_alpha_kept() -> None:
    cal = Calibration(_calibration_data(), "test")
    nbytes, probe_ms = cal.workload.total_bytes, cal.probe_allreduce_ms()
    assert probe_ms == pytest.approx(ring_all_reduce_s(nbytes, 4, ALPHA_S, 1 / BETA) * 1e3)
    for measured_ms in (0.8 * probe_ms, probe_ms, 1.3 * probe_ms):
        fitted = cal.fitted(measured_ms)
        assert fitted.alpha_s == cal.alpha_s
        simulated_ms = ring_all_reduce_s(nbytes, 4, fitted.alpha_s, 1 / fitted.beta_s_per_byte) * 1e3
        assert simulated_ms == pytest.approx(measured_ms)
        assert fitted.cluster.ring_bottleneck_gbps == pytest.approx(8 / fitted.beta_s_per_byte / 1e9)
        assert fitted.probe_allreduce_ms() == pytest.approx(probe_ms)  # the probe's own fit is kept beside it
    slower = cal.fitted(1.3 * probe_ms)
    assert slower.beta_s_per_byte > cal.beta_s_per_byte == pytest.approx(BETA)  # a copy: the probe's is unchanged
    # no reference, or one that α alone exceeds (6 ring steps of 300 µs): the probe's bandwidth
    assert cal.fitted(None).beta_s_per_byte == cal.fitted(1.0).beta_s_per_byte == pytest.approx(BETA)


def test_the_compute_is_scaled_to_the_lock_step_reference_and_the_update_kept() -> None:
    cal = Calibration(_calibration_data(), "test")
    profiled = cal.workload.forward_ms + cal.workload.backward_ms
    for measured_ms in (0.7 * profiled, profiled + 7.0, 1.4 * profiled):
        fitted = cal.fitted(None, measured_ms)
        w = fitted.workload
        assert w.forward_ms + w.backward_ms + fitted.update_ms == pytest.approx(measured_ms)
        assert fitted.update_ms == cal.update_ms == 7.0
        assert fitted.compute_factor == pytest.approx((measured_ms - 7.0) / profiled)
        # one factor for every layer: the profile's shape is kept
        for mine, theirs in zip(w.layers, cal.workload.layers, strict=True):
            assert mine.forward_ms == pytest.approx(theirs.forward_ms * fitted.compute_factor)
            assert mine.backward_ms == pytest.approx(theirs.backward_ms * fitted.compute_factor)
        assert fitted.summary()["compute_factor"] == fitted.compute_factor
        assert fitted.summary()["profile_backward_ms"] == pytest.approx(cal.workload.backward_ms)
    assert cal.compute_factor == 1.0 and cal.workload.forward_ms + cal.workload.backward_ms == profiled  # a copy
    # no reference, or one the update alone exceeds: the profile as it is
    for reference in (None, 5.0):
        assert cal.fitted(None, reference).workload is cal.workload


def test_the_overlap_rounds_are_recorded_as_the_devices_overlap_costs_and_charged_by_the_validation() -> None:
    from dataclasses import asdict

    from commsched.bench.overlap import OverlapTimes
    from commsched.bench.task_overlap import TaskOverlap

    spread = (-2.0, 0.0, 1.0, -1.0, 3.0)  # the medians are the values

    def layout(beside: float, tasks: int, mib: float) -> dict[str, Any]:
        times = (tuple(500.0 + d for d in spread), tuple(beside + d for d in spread), (tasks,) * 5, (mib,) * 5)
        return asdict(TaskOverlap(*times))

    plain = Calibration(_calibration_data(), "test")
    assert plain.overlap == {} and plain.cluster.worker_overlap_ms_per_mb() == (None,) * 4  # nothing timed
    data = _calibration_data()
    # backward 800 -> 900 ms beside an all-reduce of 20 MiB that took 300 ms beside it and 200 alone
    data["overlap"] = asdict(OverlapTimes(20 * 2**20, *(tuple(v + d for d in spread) for v in (800, 900, 300, 200))))
    # the runtime's tasks in two layouts: 6 tasks and 20 MiB grew the backward 170 ms; 1 task and 15 MiB, 110
    data["task_overlap"], data["task_overlap_large"] = layout(670.0, 6, 20.0), layout(610.0, 1, 15.0)
    cal = Calibration(data, "test")
    assert cal.overlap["overlap_ms_per_task"] == pytest.approx(5.0)
    assert cal.overlap["overlap_ms_per_mb"] == pytest.approx(7.0)
    assert cal.overlap["overlap_comm_rate"] == pytest.approx(200.0 / 300.0)
    cluster = cal.fitted(400.0, 500.0).cluster
    assert cluster.worker_overlap_ms_per_mb() == pytest.approx((7.0,) * 4)
    assert cluster.worker_overlap_ms_per_task() == pytest.approx((5.0,) * 4)
    assert cluster.worker_overlap_comm_rate() == pytest.approx((200.0 / 300.0,) * 4)
    assert cal.summary()["overlap_ms_per_mb"] == pytest.approx(7.0)  # recorded and shown
    bare = cal.fitted(400.0, 500.0).priced_cluster(overlap=False)
    assert bare.worker_overlap_ms_per_mb() == (None,) * 4 and bare.worker_overlap_comm_rate() == (None,) * 4
    # charged: the backward pays for what it overlaps
    w = cal.fitted(400.0, 500.0).workload
    charged = predict(w, cluster, ["ddp"], update_ms=7.0)["ddp"]
    assert charged > predict(w, bare, ["ddp"], update_ms=7.0)["ddp"]
    # the validation predicts with them; without them, as a calibration that timed none
    session = _session({"ddp": 900.0, "compute": 500.0, "allreduce": 400.0})
    with_rounds = predict_session(session, cal, ["ddp"], {})["rows"]["ddp"]["predicted_ms"]
    without = predict_session(session, cal, ["ddp"], {}, overlap=False)["rows"]["ddp"]["predicted_ms"]
    assert without == predict_session(session, plain, ["ddp"], {})["rows"]["ddp"]["predicted_ms"]
    assert with_rounds == pytest.approx(predict(w, cluster, ["ddp"], update_ms=7.0)["ddp"]) and with_rounds > without


def test_the_calibrated_cluster_reproduces_the_probed_all_reduce() -> None:
    cal = Calibration(_calibration_data(), "test")
    cluster = cal.cluster
    assert isinstance(cluster, Cluster) and cluster.num_workers == 4
    assert cluster.ring_bottleneck_gbps == pytest.approx(0.3)
    assert cal.summary()["fit_relative_residual"]["all_reduce"] == pytest.approx(0.0, abs=1e-9)


def test_saved_inputs_load_back_for_compare(tmp_path: Path) -> None:
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "rank0.json").write_text(json.dumps(_calibration_data()))
    cal = load_calibration(tmp_path / "cal")
    files = save_inputs(cal, tmp_path / "inputs")
    assert Workload.load(files["workload"]) == cal.workload
    assert Cluster.load(files["cluster"]).num_workers == 4


def test_tables_show_predicted_measured_and_error_per_shaping() -> None:
    cal = Calibration(_calibration_data(), "test")
    sessions = []
    for label, ddp_ms in (("1gbit", 600.0), ("300mbit", 900.0)):
        s = _session({"torch_ddp": ddp_ms, "compute": 500.0})
        s["label"] = label
        s["validation"] = predict_session(s, cal, ["torch_ddp"], {})
        sessions.append(s)
    report = {"sessions": sessions}
    md = validation_markdown(report).splitlines()
    assert md[0] == "| policy | 1gbit | 300mbit |"
    row = sessions[1]["validation"]["rows"]["torch_ddp"]
    assert md[2].startswith("| torch_ddp |") and f"/ 900 ({row['error_pct']:+.1f} %)" in md[2]
    assert md[3].startswith("| *compute, N in lock-step* |")
    assert md[-1].startswith("| median \\|error\\| (policies) |") and f"{abs(row['error_pct']):.1f} %" in md[-1]
    assert validation_table(report).row_count == 3
    assert validation_markdown({"sessions": [_session({"torch_ddp": 1.0})]}) == ""


def test_a_policy_the_simulator_refuses_keeps_its_measurement_and_says_why() -> None:
    cal = Calibration(_calibration_data(), "test")
    session = _session({"torch_ddp": 900.0, "dear": 700.0})
    out = predict_session(session, cal, ["torch_ddp", "dear"], {"dear": {"lookahead": 0}})
    assert (
        out["rows"]["dear"]["measured_ms"] == 700.0
        and "knob 'lookahead' must be a whole number" in out["rows"]["dear"]["error"]
    )
    assert out["median_abs_error_pct"] == pytest.approx(abs(out["rows"]["torch_ddp"]["error_pct"]))
    session["validation"] = out
    assert "not simulated: dear: knob 'lookahead'" in validation_markdown({"sessions": [session]})


def test_the_calibration_is_refitted_from_its_raw_samples_and_a_saved_report_revalidates() -> None:
    data = {**_calibration_data(), "alpha_s": 1.0, "beta_s_per_byte": 1.0}  # what an older fit wrote
    cal = Calibration(data, "test")
    assert cal.alpha_s == pytest.approx(ALPHA_S) and cal.beta_s_per_byte == pytest.approx(BETA)
    session = _session({"torch_ddp": 900.0, "dear": 700.0}) | {"calibration": data, "validation": {"stale": True}}
    report = {"meta": {"config": {"policies": ["torch_ddp", "dear"], "knobs": {"dear": {"threshold_mb": 4.0}}}}}
    report["sessions"] = [session]
    revalidate(report)
    expected = predict_session(session, cal, ["torch_ddp", "dear"], {"dear": {"threshold_mb": 4.0}})
    assert session["validation"] == expected


def test_the_fit_weights_each_size_by_its_own_noise_not_by_its_time() -> None:
    # small messages jitter by milliseconds, large ones repeat within 1 %: the slope must come from the large
    rate = 300e6 / 8
    samples = [
        ProbeSample("all_reduce", 16 * 1024, 2, (4.2e-3, 8.9e-3, 4.1e-3, 0.6e-3)),
        ProbeSample("all_reduce", 64 * 1024, 2, (0.8e-3, 3.4e-3, 4.2e-3, 0.5e-3)),
        *(ProbeSample("all_reduce", n, 2, (n / rate, n / rate * 1.002, n / rate * 0.998)) for n in (2**22, 2**24)),
    ]
    fit = fit_alpha_beta(samples)
    assert fit.bandwidth_gbps == pytest.approx(0.3, rel=0.02)
    assert fit.predict_s(2**24) == pytest.approx(2**24 / rate, rel=0.01)


def test_each_ddp_configuration_of_the_grid_is_predicted_with_its_buckets() -> None:
    cal = Calibration(_calibration_data(), "test")
    measured = {c.name: 800.0 for c in DDP_GRID} | {"dear": 700.0}
    rows = predict_session(_session(measured), cal, ["torch_ddp", "dear"], {})["rows"]
    assert list(rows) == ["torch_ddp", "dear", *(c.name for c in DDP_GRID if c.name != "torch_ddp")]
    w, cluster = cal.workload, cal.cluster
    # PyTorch's defaults rebuild the buckets in gradient-ready order; find_unused_parameters keeps the initial ones
    default = predict(w, cluster, ["ddp"], knobs={"ddp": {"bucket_cap_mb": 25.0}}, update_ms=7.0)["ddp"]
    assert rows["ddp[25MiB]"]["predicted_ms"] == default != rows["torch_ddp"]["predicted_ms"]
    four = predict(w, cluster, ["ddp"], knobs={"ddp": {"rebuilt": False, "bucket_cap_mb": 4.0}}, update_ms=7.0)
    assert rows["ddp[4MiB,find_unused]"]["predicted_ms"] == four["ddp"]


def test_auto_is_predicted_as_the_plans_its_runs_recorded_and_refused_when_they_recorded_none() -> None:
    cal = Calibration(_calibration_data(), "test")
    session = _session({"auto": 650.0, "dear": 700.0})
    dear4 = {"policy": "dear", "knobs": {"threshold_mb": 4.0, "lookahead": 1}}
    dear1 = {"policy": "dear", "knobs": {"threshold_mb": 1.0, "lookahead": 1}}
    wfbp = {"policy": "wfbp", "knobs": {}}
    session["runs"] = {"auto": [{"plan": wfbp}, {"plan": dear4}, {"plan": dear1}]}
    rows = predict_session(session, cal, ["auto", "dear"], {})["rows"]
    w, cluster = cal.workload, cal.cluster
    each = [predict(w, cluster, [p["policy"]], knobs={p["policy"]: p["knobs"]}, update_ms=7.0)[p["policy"]]
            for p in (wfbp, dear4, dear1)]  # fmt: skip
    assert len(set(each)) == 3  # three different predictions: the median is one of them, not an average
    assert rows["auto"]["predicted_ms"] == sorted(each)[1]
    assert rows["auto"]["simulated_as"].startswith("dear ")  # the policy most repeats ran
    validated = {"sessions": [{**session, "validation": {"rows": rows, "median_abs_error_pct": 1.0}}]}
    assert "as dear" in validation_markdown(validated)
    session["runs"] = {"auto": [{}]}
    assert "did not record" in predict_session(session, cal, ["auto"], {})["rows"]["auto"]["error"]


def test_a_policy_is_predicted_with_the_knobs_its_runs_recorded_not_todays_defaults() -> None:
    # ps's fuse_kb default went from 0 to 64: a run that recorded 0 is predicted unfused, one that recorded
    # 64 fused, one that recorded no plan as the code before the change (unfused)
    cal = Calibration(_calibration_data(), "test")
    w, cluster = cal.workload, cal.cluster
    fused, unfused = (predict(w, cluster, ["ps"], knobs={"ps": {"fuse_kb": kb}}, update_ms=7.0)["ps"] for kb in (64, 0))
    assert fused != unfused
    for recorded, expected in (({"fuse_kb": 0.0}, unfused), ({"fuse_kb": 64.0}, fused), (None, unfused)):
        session = _session({"ps": 800.0})
        session["runs"] = {"ps": [{"plan": {"policy": "ps", "knobs": recorded}} if recorded is not None else {}]}
        assert predict_session(session, cal, ["ps"], {})["rows"]["ps"]["predicted_ms"] == expected, recorded


def test_the_ps_transport_is_priced_by_its_own_probed_cpu_work() -> None:
    data = _calibration_data()
    sizes = (2**16, 2**20, 2**24)

    def cpu(per_op_s: float, per_byte_s: float, n: int) -> list[float]:
        return [per_op_s + per_byte_s * n] * 3

    for s in data["samples"]:  # gloo's all-reduce: 1.2 ms per op, 0.8 ms per MiB
        s["cpu_seconds"] = cpu(1.2e-3, 0.8e-3 / 2**20, s["nbytes"])
    ps_samples = [{"op": "ps", "nbytes": n, "world_size": 4, "seconds": [2e-3 + n * BETA] * 3,
                   "cpu_seconds": cpu(0.4e-3, 0.6e-3 / 2**20, n)} for n in sizes]  # fmt: skip
    with_ps = Calibration({**data, "samples": [*data["samples"], *ps_samples]}, "test")
    without = Calibration(data, "test")
    assert without.ps_cpu is None and with_ps.ps_cpu is not None
    assert with_ps.ps_cpu.per_op_ms == pytest.approx(0.4) and with_ps.ps_cpu.ms_per_mb == pytest.approx(0.6)
    # the α-β fits, the summary's residuals, stay the collectives' (a push and its pull follow no ring formula)
    assert with_ps.alpha_s == pytest.approx(without.alpha_s)
    summary = with_ps.summary()
    assert set(summary["fit_relative_residual"]) == {"all_reduce"}
    assert summary["ps_cpu_per_pair_ms"] == pytest.approx(0.4) and summary["ps_cpu_ms_per_mb"] == pytest.approx(0.6)
    measured = {"ps": 900.0, "wfbp": 800.0}
    rows_with = predict_session(_session(measured), with_ps, ["ps", "wfbp"], {})["rows"]
    rows_without = predict_session(_session(measured), without, ["ps", "wfbp"], {})["rows"]
    # ps's push and pull are charged half the pair's fit each, less than an all-reduce's: ps predicted faster;
    # a collective policy is predicted as before
    assert rows_with["ps"]["predicted_ms"] < rows_without["ps"]["predicted_ms"]
    assert rows_with["wfbp"]["predicted_ms"] == rows_without["wfbp"]["predicted_ms"]
    w, cluster = with_ps.workload, with_ps.cluster
    unfused = {"ps": {"fuse_kb": 0.0}}  # no plan recorded: ps as it ran before it fused by default
    expected = predict(w, cluster, ["ps"], knobs=unfused, update_ms=7.0, cpu=with_ps.cpu, ps_cpu=with_ps.ps_cpu)["ps"]
    assert rows_with["ps"]["predicted_ms"] == pytest.approx(expected)


def test_pytorch_ddp_rows_are_priced_by_the_backends_own_all_reduce_and_the_runtime_by_its_own() -> None:
    data = _calibration_data()

    def cpu(per_op_s: float, per_byte_s: float, n: int) -> list[float]:
        return [per_op_s + per_byte_s * n] * 3

    for s in data["samples"]:  # the runtime's all-reduce: 0.05 ms per op, 0.3 ms per MiB
        s["cpu_seconds"] = cpu(0.05e-3, 0.3e-3 / 2**20, s["nbytes"])
    gloo_alpha_s = 4 * ALPHA_S
    gloo = [{"op": "gloo_all_reduce", "nbytes": n, "world_size": 4,
             "seconds": [ring_all_reduce_s(n, 4, gloo_alpha_s, 1 / BETA)] * 3,
             "cpu_seconds": cpu(1.2e-3, 0.8e-3 / 2**20, n)} for n in (2**16, 2**20, 2**24)]  # fmt: skip
    both = Calibration({**data, "samples": [*data["samples"], *gloo]}, "test")
    runtime_only = Calibration(data, "test")
    assert runtime_only.gloo_cpu is None and runtime_only.as_pytorch_ddp() is runtime_only  # older reports
    assert both.gloo_cpu is not None and both.gloo_cpu.per_op_ms == pytest.approx(1.2)
    assert both.alpha_s == pytest.approx(ALPHA_S)  # the runtime's fit stays the calibration's
    ddp_priced = both.as_pytorch_ddp()
    assert ddp_priced.alpha_s == pytest.approx(gloo_alpha_s) and ddp_priced.cpu == both.gloo_cpu
    assert both.summary()["gloo_cpu_per_task_ms"] == pytest.approx(1.2)
    measured = {"ddp": 800.0, "torch_ddp": 800.0, YARDSTICK: 800.0}
    rows_both = predict_session(_session(measured), both, ["ddp"], {})["rows"]
    rows_runtime = predict_session(_session(measured), runtime_only, ["ddp"], {})["rows"]
    assert rows_both["ddp"]["predicted_ms"] == rows_runtime["ddp"]["predicted_ms"]  # the runtime's own
    for name in ("torch_ddp", YARDSTICK):  # PyTorch's DDP pays gloo's α and CPU work: predicted slower
        assert rows_both[name]["predicted_ms"] > rows_runtime[name]["predicted_ms"], name


def test_pytorch_ddps_bucket_copies_are_charged_to_its_rows_alone_where_the_calibration_timed_them() -> None:
    from commsched.bench.copies import BucketCopies, with_bucket_copies

    data = _calibration_data()
    measured = {"torch_ddp": 900.0, "ddp": 850.0, "ddp[25MiB]": 880.0, "compute": 500.0, "allreduce": 400.0}
    before = predict_session(_session(measured), Calibration(data, "test"), ["torch_ddp", "ddp"], {})["rows"]
    copies = BucketCopies(2**20, (0.4,), (0.3,))
    data["bucket_copies"] = {"nbytes": 2**20, "in_ms": [0.4], "out_ms": [0.3]}
    cal = Calibration(data, "test")
    out = predict_session(_session(measured), cal, ["torch_ddp", "ddp"], {})
    rows = out["rows"]
    assert rows["ddp"]["predicted_ms"] == before["ddp"]["predicted_ms"]  # the runtime writes into its buckets
    fitted = cal.fitted(400.0, 500.0)
    charged, update_ms = with_bucket_copies(fitted.workload, 7.0, copies)
    default = predict(charged, fitted.cluster, ["ddp"], knobs={"ddp": {"bucket_cap_mb": 25.0}}, update_ms=update_ms)
    assert rows["ddp[25MiB]"]["predicted_ms"] == default["ddp"] > before["ddp[25MiB]"]["predicted_ms"]
    assert rows["torch_ddp"]["predicted_ms"] > before["torch_ddp"]["predicted_ms"]
    assert rows["compute"] == before["compute"]  # the references copy nothing
    assert out["calibration"]["ddp_copy_in_ms_per_mb"] == pytest.approx(0.4)
    assert out["calibration"]["ddp_copy_out_ms_per_mb"] == pytest.approx(0.3)
