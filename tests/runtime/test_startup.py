"""Plans as files, start-up agreement, refusals before any communication, hung peers, launch order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _startup_workers as S
import pytest
from _processes import process

from commsched.cluster import Cluster
from commsched.profile import profile_model
from commsched.schedule import CommPlan, build_plan, make_knobs, policy_class
from commsched.sim import simulate
from commsched.sim.simulator import simulate_plan
from commsched.transport.base import HOST_MEMORY

import _models as M
from _workers import SMALL_KNOBS
from conftest import free_port, spawn

pytestmark = pytest.mark.multiproc
TOL = 1e-5  # see test_equivalence


def _two_workers() -> Cluster:
    nic = {"bandwidth_gbps": 1.0, "latency_us": 50.0}
    nodes = [
        {"name": f"n{i}", "devices": [{"name": "cpu", "speed": 1.0, "memory_gib": 16}], "nic": nic} for i in (0, 1)
    ]
    return Cluster.from_dict({"name": "two", "nodes": nodes})


@pytest.fixture(scope="module")
def simulated_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Profile the test model, simulate DeAR on two workers, save the plan the simulator ran."""
    model = M.fresh()
    loss_fn = __import__("torch").nn.CrossEntropyLoss()
    workload = profile_model(
        model, lambda: M.batch(0, 0), loss_fn, batch_size=8, model_name="TrickyNet", device=M.DEVICE, warmup=1,
        repeats=3,
    )  # fmt: skip
    result = simulate(workload, _two_workers(), "dear", 3, 1, **SMALL_KNOBS["dear"])
    assert result.plan is not None
    path = Path(tmp_path_factory.mktemp("plan")) / "plan.json"
    result.plan.save(path)
    return path


def test_a_plan_saved_by_the_simulator_trains_like_the_policy_by_name_and_like_ddp(
    simulated_plan: Path, tmp_path: Path
) -> None:
    res = spawn(S.plan_file, 2, tmp_path, str(simulated_plan), 5)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["moved"] > 1e-3
        assert r["plan_vs_ddp"] < TOL and r["by_name_vs_ddp"] < TOL
        assert r["plan_in_use"] == "dear"
        assert r["wrong_world"].startswith("PlanMismatchError: plan: made for 3 rank(s), this run has 2")
        assert r["wrong_order"].startswith("PlanMismatchError: plan: the model does not run as the plan expects")


@pytest.mark.parametrize(
    ("what", "named"),
    [
        ("policy", "policy: rank 0 has dear, rank 1 has ddp"),
        ("knob", "knobs: rank 0 has"),
        ("shape", "parameters"),
        ("batch_sizes", "batch sizes: rank 0 has (1, 1), rank 1 has (2, 2)"),
    ],
)
def test_ranks_that_disagree_all_end_with_an_error_naming_the_difference(tmp_path: Path, what: str, named: str) -> None:
    res = spawn(S.disagree, 2, tmp_path, what, timeout_s=120)
    for r in res:
        assert "missing" not in r, r
        assert r["outcome"].startswith("RuntimeCommError: parallelize: the ranks disagree on"), r["outcome"]
        assert named in r["outcome"]
        assert r["seconds"] < 20


def test_every_bad_argument_is_refused_at_parallelize_before_any_communication(tmp_path: Path) -> None:
    res = spawn(S.refuse_early, 2, tmp_path, timeout_s=120)
    cases = res[0]
    assert "missing" not in cases, cases
    expected = {
        "unknown_knob": "ScheduleError: dear: unknown knob(s) 'colour'; known: threshold_mb, lookahead",
        "wrong_type": "ScheduleError: ddp: knob 'rebuilt' must be true or false, got 'False'",
        "out_of_range": "ScheduleError: dear: knob 'threshold_mb' must be a number > 0, got -1",
        "unknown_policy": "ValueError: policy: unknown policy 'fastest'",
        "grad_scaler": "UnsupportedError: GradScaler: dear applies updates after step() returns",
        "lbfgs": "UnsupportedError: optimizer: LBFGS needs every parameter at once",
        "frozen": "ValueError: model: TrickyNet has no trainable parameters",
        "warmup": "ValueError: warmup_iters: must be a whole number >= 1, got 0",
        "torch_ddp_knobs": "ValueError: torch_ddp: takes no knobs, got bucket_cap_mb",
    }
    for name, start in expected.items():
        assert cases[name]["outcome"].startswith(start), (name, cases[name]["outcome"])
        assert cases[name]["seconds"] < 5, name  # a collective would have waited for rank 1


@pytest.mark.parametrize(
    ("world", "policy", "where"),
    [(2, "dear", "forward"), (3, "bytescheduler", "backward"), (3, "ddp", "forward")],
)
def test_a_stopped_peer_ends_every_other_rank_within_the_timeout(
    tmp_path: Path, world: int, policy: str, where: str
) -> None:
    timeout_s = 5.0  # each rank ends within it plus start-up; longer only lengthens the suite
    port = free_port()
    procs = [process(S.stopped_peer, (r, world, port, str(tmp_path), policy, where, timeout_s)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs[:-1]:
            p.join(timeout_s + 120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    for r in range(world - 1):
        f = tmp_path / f"rank{r}.json"
        assert f.exists(), f"rank {r} hung"
        res = json.loads(f.read_text())
        assert res["outcome"].startswith("RuntimeCommError"), res["outcome"]
        assert 0 <= res["seconds"] < timeout_s + 10, res


def _steady_order(order: list[list], iteration: int) -> list[str]:
    return [name for it, name in order if it == iteration]


#: the launch order's cases, run one after another in one pair of processes (:func:`launch_orders`)
LAUNCH_CASES = [
    ("ddp", SMALL_KNOBS["ddp"]),
    ("wfbp", {}),
    ("horovod", SMALL_KNOBS["horovod"]),
    ("dear", SMALL_KNOBS["dear"]),
    ("no_overlap", SMALL_KNOBS["no_overlap"]),
    # completion-driven: a credit window that never binds makes their order independent of timing
    ("bytescheduler", {"partition_mb": 0.0004, "credit_mb": 1000.0}),
    ("prophet", {"partition_mb": 0.0004, "credit_mb": 1000.0}),
]
LAUNCH_STEPS = 5


@pytest.fixture(scope="module")
def launch_orders(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every case of :data:`LAUNCH_CASES` trained in turn by the same 2 processes (one spawn, not seven)."""
    return spawn(S.launch_orders, 2, tmp_path_factory.mktemp("launch"), LAUNCH_CASES, LAUNCH_STEPS)


@pytest.mark.parametrize(("policy", "knobs"), LAUNCH_CASES)
def test_the_runtimes_launch_order_is_the_simulators_on_the_same_profile(
    launch_orders: list[dict], policy: str, knobs: dict
) -> None:
    for r in launch_orders:
        assert "error" not in r and "missing" not in r and policy in r, r
    res = [r[policy] for r in launch_orders]
    plan = CommPlan.from_json(res[0]["plan"])
    assert plan.policy == policy and all(getattr(plan.knobs, k) == v for k, v in knobs.items()), plan.knobs
    # the runtime's own plan, so the scheduler decides from the same network estimate (Prophet's blocks fit the
    # gaps by the estimated transfer time: a fresh plan for the test's cluster would size them differently)
    result = simulate_plan(plan, _two_workers(), 3, 1)
    assert result.trace is not None
    sim_events = sorted(
        (e for e in result.trace.events if e.kind in ("all_reduce", "reduce_scatter", "all_gather") and e.worker == 0),
        key=lambda e: e.start_s,
    )
    simulated = [e.task for e in sim_events if e.iteration == 2]
    assert simulated, "nothing simulated: the test would prove nothing"
    last_full = LAUNCH_STEPS - 2  # the last iteration whose all-gathers the next forward launched
    for r in res:
        assert _steady_order(r["order"], last_full) == simulated, policy


def test_switching_plans_mid_run_between_update_modes_still_trains_like_ddp(tmp_path: Path) -> None:
    res = spawn(S.switch_plans, 2, tmp_path, 3)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["updates"] == ["forward", "step", "forward"]
        assert r["moved"] > 1e-3 and r["diff"] < TOL, r


def test_auto_runs_what_advise_ranks_first_and_replans_without_changing_the_result(tmp_path: Path) -> None:
    from commsched.plan import advise
    from commsched.plan.gloo import gloo_options, measured_cpu
    from commsched.profile.probe_fit import measured_cluster
    from commsched.runtime.switching import KNOB_MARGIN
    from commsched.sim import SimOptions

    res = spawn(S.auto_policy, 2, tmp_path, 12)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["moved"] > 1e-3 and r["diff"] < TOL, r
        assert r["replans"] >= 1
    first = CommPlan.from_json(res[0]["first_plan"])
    net = first.network
    assert net.cpu_per_message_s > 0, "the warm-up measured no CPU cost of a message"
    on_gloo_cpu = first.workload.device == "cpu"
    if on_gloo_cpu:  # the "ps" transport's push and pull, timed apart in the warm-up
        ((name, per_task_s, per_byte_s),) = net.transport_cpu
        assert name == "ps" and per_task_s + per_byte_s > 0, net.transport_cpu
    cluster = measured_cluster(net.latency_s, 1.0 / net.bandwidth_bytes_per_s, net.world_size)
    cpu = measured_cpu(net)
    # as the runtime does (runtime/api.py): gloo's CPU costs are charged for CPU tensors only (gloo with CUDA
    # tensors, as on a GPU machine, is priced like NCCL, and there near-ties make another ranking), and off the CPU
    # a plan whose transports take CPU tensors only is passed over (the test's model is on one device)
    gloo_pricing: dict[str, Any] = {
        "sim_options": SimOptions(**cpu),
        "options_for": lambda policy, knobs: gloo_options(first.workload, cluster, policy, **cpu, **knobs),
    }
    # and with auto's own demand on searched knobs (they replace a policy's defaults only when predicted more
    # than KNOB_MARGIN faster; advise's default asks for less, and the rankings then differ where a policy's
    # searched knobs gain between the two)
    advice = advise(
        first.workload,
        cluster,
        budget_s=30.0,
        defaults_margin=KNOB_MARGIN,
        **(gloo_pricing if on_gloo_cpu else {}),
    )
    assert not advice.budget_exhausted
    runnable = [
        c
        for c in advice.candidates
        if on_gloo_cpu
        or not {t.transport for t in build_plan(c.policy, first.workload, first.network, **c.knobs).tasks} & HOST_MEMORY
    ]
    # compared as plans built on the warm-up's network: a knob the policy resolves from the network (ps's fuse_kb:
    # none) is recorded resolved in the plan
    best = build_plan(runnable[0].policy, first.workload, first.network, **runnable[0].knobs)
    assert (first.policy, first.knobs) == (best.policy, best.knobs)


def test_a_checkpoint_keeps_the_plan_in_use_and_restoring_it_continues_exactly(tmp_path: Path) -> None:
    res = spawn(S.checkpoint_with_plan, 2, tmp_path, 4)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["same_plan"] and r["diff"] < TOL, r


def _auto_policies(worker: Any, tmp_path: Path, steps: int, replans: int) -> list[str]:
    """Run ``worker`` on 2 ranks; each matched DDP and switched ``replans`` times, both alike. Returns the
    plan's policy after every step (``p[k]``: after step k)."""
    res = spawn(worker, 2, tmp_path, steps)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["diff"] < TOL, r
        assert r["replans"] == replans, r["policies"]
    assert res[0]["policies"] == res[1]["policies"]
    return list(res[0]["policies"])


def test_auto_measures_the_warm_ups_plan_like_its_trials_when_both_seem_slower_and_keeps_the_fastest(
    tmp_path: Path,
) -> None:
    p = _auto_policies(S.auto_trial, tmp_path, 20, replans=2)  # to the runner-up, then the warm-up's plan, kept
    assert len(set(p[1:6])) == len(set(p[6:11])) == len(set(p[11:])) == 1, p  # 4 iterations each, then stay
    assert len({p[1], p[6], p[11]}) == 3 and p[11] == "no_overlap", p


def test_auto_keeps_a_trial_when_the_warm_ups_plan_measured_alike_is_slower(tmp_path: Path) -> None:
    p = _auto_policies(S.auto_trial_warmup_slower, tmp_path, 20, replans=3)  # runner-up, warm-up's, runner-up
    assert p[11] == "no_overlap" and p[16] == p[-1] == p[6] != p[1], p


def test_auto_goes_back_to_its_choice_when_the_runner_up_measured_slower(tmp_path: Path) -> None:
    p = _auto_policies(S.auto_trials_keep_first, tmp_path, 16, replans=2)  # to the runner-up and back
    assert p[1] != p[6] and p[1] == p[11] == p[-1], " ".join(p)
    assert policy_class(p[1]).update_mode != policy_class(p[6]).update_mode, p  # the runner-up: the other kind


def test_auto_measures_near_ties_too_and_keeps_the_fastest_of_all_its_trials(tmp_path: Path) -> None:
    p = _auto_policies(S.auto_trials_near_ties, tmp_path, 25, replans=3)  # runner-up, two near-ties, then stay
    assert [len(set(p[k : k + 5])) for k in (1, 6, 11, 16)] == [1, 1, 1, 1], p  # 4 iterations each after the switch
    assert len({p[1], p[6], p[11], p[16]}) == 4 and set(p[16:]) == {p[16]}, p  # four policies; the last kept
    assert policy_class(p[1]).update_mode != policy_class(p[6]).update_mode, p  # the runner-up: the other kind


@pytest.mark.parametrize("outcome", ["within", "beaten", "overturned"])
def test_auto_measures_ddps_schedule_at_its_defaults_and_keeps_it_unless_beaten_by_the_margin_twice(
    tmp_path: Path, outcome: str
) -> None:
    res = spawn(S.auto_trials_reference, 2, tmp_path, 26, outcome)
    # to the runner-up, to the reference; beaten: back to ps, measured again and kept; overturned: back to the reference
    replans = {"within": 2, "beaten": 3, "overturned": 4}[outcome]
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["diff"] < TOL and r["replans"] == replans, r
    assert res[0]["policies"] == res[1]["policies"] and res[0]["knobs"] == res[1]["knobs"]
    p, knobs = res[0]["policies"], res[0]["knobs"]
    assert (p[1], p[6], p[11]) == ("ps", "horovod", "ddp") and knobs[11] == make_knobs("ddp").to_dict(), p
    if outcome == "within":
        assert set(p[16:]) == {"ddp"}, p
    else:  # ps measured again over iterations 16-20, then kept or left for the reference
        assert set(p[16:21]) == {"ps"} and set(p[21:]) == {"ps" if outcome == "beaten" else "ddp"}, p


def test_tensors_of_several_dtypes_are_broadcast_in_place_from_the_source_rank(tmp_path: Path) -> None:
    res = spawn(S.broadcast_mixed, 2, tmp_path, timeout_s=120)
    for r in res:
        assert "error" not in r and "missing" not in r, r
        assert r["same_objects"]
        assert r["values"] == [
            [[20.0, 21.0, 22.0], [23.0, 24.0, 25.0]],
            [20.0] * 4,
            [20],
            [[20.0, 22.0, 24.0], [21.0, 23.0, 25.0]],
        ]


@pytest.mark.parametrize("hashed_group", [False, True], ids=["groups released", "a hashed group lives"])
def test_runs_one_after_another_in_a_process_release_their_groups_and_threads(
    tmp_path: Path, hashed_group: bool
) -> None:
    # direct reduce-scatters and all-gathers, plain all-reduces, the TCP transport; rank 0 deciding for both
    policies = ["dear", "ddp", "ps", "dear", "prophet"]
    res = spawn(S.repeated_runs, 2, tmp_path, policies, hashed_group)
    for rank, r in enumerate(res):
        assert "error" not in r and "missing" not in r, r
        assert max(r["diffs"]) < TOL, r  # every run still trains like DDP, the later ones on new groups
        # each gloo group wakes its loop 100 times a second: the control group (which also syncs and opens the
        # leader's channel) and the transports' group; between 2 ranks dear's reduce-scatters and all-gathers
        # go over the direct connections, so the ring's group never opens
        assert r["loops"] == [2, 2, 2, 2, 2], r
        # ddp's and prophet's all-reduces and dear's reduce-scatters and all-gathers go over the direct
        # connections: the training thread keeps them and completes them itself where their data has come
        # (under prophet rank 0's too, though it decides on completions: at least the first of each backward;
        # rank 1 keeps those whose orders its training thread read, which depends on timing); ps's push and
        # pull have no such transport: the watcher waits for all of those
        assert r["here"][1] > 0 and r["here"][2] == 0 and r["here"][0] > 0 and r["here"][3] > 0, r
        assert rank == 1 or r["here"][4] >= 2, r  # two iterations
        threads, groups = r["before"]
        if hashed_group:  # destroying could hand a later group a live name: every run's groups are kept
            assert [g for _, g in r["after"]] == sorted(g for _, g in r["after"]) and r["after"][-1][1] > groups, r
        else:
            assert all(g == groups for _, g in r["after"]), r
            assert all(t <= threads + 1 for t, _ in r["after"]), r  # each run made 15 or more threads
