"""Real namespaces: a 2-worker testbed trains dear and PyTorch DDP's grid over a shaped link, and leaves nothing behind.

Needs root and iproute2; skipped otherwise, with the reason.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _signals import ended_within

from commsched.bench.baselines import DDP_GRID
from commsched.bench.config import BenchConfig
from commsched.bench.run import run_bench
from commsched.cluster import Cluster
from commsched.plan.gloo import gloo_options
from commsched.sim import simulate
from commsched.testbed import (
    LinkShape,
    NetnsTestbed,
    TestbedError,
    netns_unavailable_reason,
    project_objects,
    remove_leftovers,
)
from commsched.testbed.probe import probe_link
from commsched.trace import Trace
from commsched.trace.compare import compare_traces, summarize
from commsched.workload import Workload

_REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}")]

LIGHT = LinkShape(rate_bps=2 * 10**9)


def _config(**kw: object) -> BenchConfig:
    base: dict[str, object] = {
        "model": "cnn",
        "workers": 2,
        "shapes": (LIGHT,),
        "policies": ("torch_ddp", "dear"),
        "iters": 2,
        "warmup": 3,
        "repeats": 1,
        "batch": 4,
        "references": False,
        "probe": False,
        "comm_timeout_s": 20.0,
        "isolation": "netns",
    }
    return BenchConfig(**{**base, **kw})  # type: ignore[arg-type]


def _mine() -> list[str]:
    return project_objects(f"csb-{os.getpid()}-")


def test_two_policies_train_alike_over_a_shaped_link_and_everything_is_removed(tmp_path: Path) -> None:
    report = run_bench(_config(validate=True), tmp_path)
    (session,) = report["sessions"]
    assert session["label"] == "2gbit" and "rate 2Gbit" in session["qdiscs"]
    dear = session["summary"]["dear"]
    assert dear["max_param_diff"] < 1e-5
    assert dear["min_param_moved"] > 1e-4  # training did change the model
    assert dear["replica_spread"] == 0.0 and session["summary"]["torch_ddp"]["replica_spread"] == 0.0
    # the DDP grid ran beside the policies: every configuration trains alike, default and best DDP are named
    grid = [c.name for c in DDP_GRID]
    assert all(session["summary"][name]["max_param_diff"] < 1e-5 for name in grid if name != "torch_ddp")
    assert session["default_ddp"] == "ddp[25MiB]" and session["best_ddp"] in grid
    assert dear["speedup_vs_default_ddp"] > 0 and dear["speedup_vs_best_ddp"] > 0
    for run in session["runs"]["dear"]:
        assert len(run["times_s"]) == 2 and len(run["times_s"][0]) == 5 and len(run["rank_iteration_ms"]) == 2
        assert run["iteration_ms"] == max(run["rank_iteration_ms"]) > 0
        threads = run["thread_cpu_ms"]  # per rank: each thread name's CPU per timed iteration
        assert len(threads) == 2 and all(sum(rank.values()) > 0 for rank in threads), threads
        waits = run["thread_wait_ms"]  # per rank: each thread name's time runnable but off the cores
        assert len(waits) == 2 and all(rank and min(rank.values()) >= 0 for rank in waits), waits
        sleeps = run["thread_sleeps"]  # per rank: how often each thread name blocked, per timed iteration
        assert len(sleeps) == 2 and all(rank and min(rank.values()) >= 0 for rank in sleeps), sleeps
    assert session["traces"] == {"dear": "trace-2gbit-dear.json"} and (tmp_path / "trace-2gbit-dear.json").exists()
    # --validate: calibrated on these links before the policies ran, then every policy predicted
    validation = session["validation"]
    assert set(validation["rows"]) == {"dear", *grid}
    assert all(r["predicted_ms"] > 0 and r["measured_ms"] > 0 for r in validation["rows"].values())
    # (not compared with the 2 Gbit/s shaping: cnn's messages are small enough to pass in tbf's burst)
    assert 0 < validation["calibration"]["bandwidth_mbit_s"] < math.inf
    # PyTorch DDP's copies into its buckets and back were timed, and its rows charged with them
    assert validation["calibration"]["ddp_copy_in_ms_per_mb"] > 0 < validation["calibration"]["ddp_copy_out_ms_per_mb"]
    workload = Workload.load(session["calibration_files"]["workload"])
    assert workload.model == "cnn" and workload.batch_size == 4
    cluster = Cluster.load(session["calibration_files"]["cluster"])
    predicted = simulate(workload, cluster, "dear", 6, 3, options=gloo_options(workload, cluster, "dear")).trace
    assert predicted is not None
    measured = Trace.load(tmp_path / "trace-2gbit-dear.json")
    kinds = ("forward", "backward", "reduce_scatter", "all_gather")  # the runtime traces no waits
    rows = compare_traces(predicted, measured, skip_predicted=3, skip_measured=3, kinds=kinds)
    assert summarize(rows).matched == len(rows) > 0  # the same tasks on both sides
    assert _mine() == []


def test_auto_records_the_plans_its_trials_measured_and_the_one_it_kept(tmp_path: Path) -> None:
    from commsched.bench.config import AUTO_WARMUP
    from commsched.runtime.switching import MAX_TRIALS
    from commsched.schedule import policy_class

    report = run_bench(_config(policies=("auto",), warmup=AUTO_WARMUP, iters=1, ddp_grid=False), tmp_path)
    (run,) = report["sessions"][0]["runs"]["auto"]
    # its choice and the runner-up, each measured; then near-ties; the warm-up's plan when all seemed slower
    trials = run["trials"]
    first, second, *_ = trials
    assert all(t["mean_ms"] > 0 for t in trials), trials
    assert policy_class(first["policy"]).update_mode != policy_class(second["policy"]).update_mode
    plans = [json.dumps([t["policy"], t["knobs"]], sort_keys=True) for t in trials]
    assert len(set(plans)) == len(plans) <= MAX_TRIALS, trials  # each measured once (a policy at two settings)
    # the fastest is kept, knobs too: by its second reading where it was measured again, the reference (DDP's
    # schedule at its defaults) where that is within the margin
    from commsched.runtime.replan import TRIAL_MARGIN, choose
    from commsched.schedule import make_knobs

    readings = [t["mean_ms"] for t in trials]
    if run.get("again") and run["again"]["mean_ms"] is not None:
        readings[run["again"]["trial"]] = run["again"]["mean_ms"]
    defaults = make_knobs("ddp").to_dict()
    reference = next((i for i, t in enumerate(trials) if t["policy"] == "ddp" and t["knobs"] == defaults), None)
    fastest = trials[choose(readings, None, TRIAL_MARGIN, reference)]  # type: ignore[index]
    assert run["plan"] == {"policy": fastest["policy"], "knobs": fastest["knobs"]}
    assert report["sessions"][0]["summary"]["auto"]["max_param_diff"] < 1e-5
    assert _mine() == []


def test_a_dead_worker_ends_the_run_with_a_clear_error_and_everything_is_removed(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TestbedError, match=r"rank 1 exited with status 17") as info:
        run_bench(_config(policies=("dear",), fail={"rank": 1, "policy": "dear", "step": 4}), tmp_path)
    assert "dying on purpose" in str(info.value)
    assert time.monotonic() - start < 60
    assert _mine() == []


def test_links_deliver_the_shaped_rate(tmp_path: Path) -> None:
    with NetnsTestbed(2, LinkShape(rate_bps=200 * 10**6), log=lambda m: None) as bed:
        check = probe_link(bed, tmp_path, mib=6)
    assert 150 < check["throughput_mbit_s"] <= 205
    assert _mine() == []


def test_delay_without_netem_is_refused_clearly_or_applied() -> None:
    with NetnsTestbed(2, log=lambda m: None) as bed:
        if bed._has_netem():
            bed.set_shape(LinkShape(rate_bps=10**9, delay_ms=1, loss_pct=0.1))
            assert "netem" in bed.qdiscs()
        else:
            with pytest.raises(TestbedError, match="CONFIG_NET_SCH_NETEM"):
                bed.set_shape(LinkShape(delay_ms=1))
    assert _mine() == []


_HOLDER = textwrap.dedent(
    """
    import signal, sys, time
    from commsched.testbed import NetnsTestbed
    # Ctrl-C as in a terminal, whatever this process inherited (a background start ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    bed = NetnsTestbed(2)
    with bed:
        print(bed.prefix, flush=True)
        time.sleep(120)
    """
)


def _start_holder() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    assert prefix.startswith("csb-") and project_objects(prefix), prefix
    return proc, prefix


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_removes_everything(sig: signal.Signals) -> None:
    proc, prefix = _start_holder()
    proc.send_signal(sig)
    ended_within(proc, 30)
    assert project_objects(prefix) == []


def test_leftovers_of_a_killed_run_are_removed_by_the_next_with_a_message() -> None:
    proc, prefix = _start_holder()
    proc.kill()
    proc.wait(timeout=30)
    assert len(project_objects(prefix)) == 3  # SIGKILL cannot be handled: w0, w1, br stay
    messages: list[str] = []
    removed = remove_leftovers(messages.append)
    assert {item.name for item in removed} >= {f"{prefix}w0", f"{prefix}w1", f"{prefix}br"}
    assert project_objects(prefix) == []
    assert messages and str(proc.pid) in messages[0]
