"""The drift rule: a baseline window, a relative threshold, patience, and the factors to re-plan with."""

from __future__ import annotations

import pytest

from commsched.runtime.replan import DriftMonitor, DriftPolicy


def _window(m: DriftMonitor, compute_s: float, bandwidth: float) -> tuple[float, float] | None:
    for _ in range(5):
        m.record_iteration(compute_s)
    m.record_transfer(bandwidth * 2.0, 2.0)
    return m.drifted()


def test_the_first_window_is_the_baseline_and_small_changes_never_replan() -> None:
    m = DriftMonitor(DriftPolicy(every=5, threshold=0.25, patience=2))
    assert _window(m, 0.100, 1e9) is None  # baseline
    for _ in range(10):
        assert _window(m, 0.120, 0.9e9) is None  # within 25 %


def test_a_drift_replans_only_after_patience_windows_in_a_row_with_the_measured_factors() -> None:
    m = DriftMonitor(DriftPolicy(every=5, threshold=0.25, patience=2))
    _window(m, 0.100, 1e9)
    assert _window(m, 0.100, 0.5e9) is None  # one drifted window: not yet
    assert _window(m, 0.100, 1e9) is None  # back to normal: the count restarts
    assert _window(m, 0.100, 0.5e9) is None
    factors = _window(m, 0.200, 0.5e9)
    assert factors == pytest.approx((2.0, 0.5))
    assert _window(m, 0.200, 0.5e9) is None  # a new baseline after re-planning


@pytest.mark.parametrize(
    ("field", "value"), [("every", 1), ("every", 2.5), ("threshold", 0), ("patience", 0), ("patience", True)]
)
def test_bad_drift_settings_are_refused_naming_the_setting(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"replan {field}: must be"):
        DriftPolicy(**{field: value})  # type: ignore[arg-type]


def test_the_fastest_trial_is_kept_unless_it_is_slower_than_the_warm_up_by_the_margin() -> None:
    from commsched.runtime.replan import TRIAL_MARGIN, choose

    assert choose([0.110, 0.104], 0.100, TRIAL_MARGIN) == 1  # both within the margin: the faster
    assert choose([0.090, 0.104], 0.100, TRIAL_MARGIN) == 0  # the first, faster than the warm-up too
    assert choose([0.2, 0.100 * (1 + TRIAL_MARGIN) + 0.01], 0.100, TRIAL_MARGIN) is None  # the warm-up's plan
    assert choose([0.2, 0.3], None, TRIAL_MARGIN) == 0  # no warm-up measured: the fastest
    assert choose([None, 0.3], 0.1, TRIAL_MARGIN) is None  # an unmeasured trial takes no part
    assert choose([None, None], 0.1, TRIAL_MARGIN) == 1  # nothing measured: stay


def test_the_trials_means_choose_the_plan_and_the_others_are_left_out() -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=2, measures=True)
    # a steady plan over iterations 3-6, iteration 6's step ending at 10.410 s
    r.periods = {1: 0.105, 3: 0.104, 4: 0.106, 5: 0.102}
    r._last_start = (6, 10.300)
    first = r.trial_mean(3, 10.410)
    assert first == pytest.approx((0.104 + 0.106 + 0.102 + 0.110) / 4)
    # then one alternating fast and slow: its median (0.095) is below the first's, its mean is not
    r.periods.update({8: 0.090, 9: 0.150, 10: 0.095})
    r._last_start = (11, 20.000)
    second = r.trial_mean(8, 20.150)
    assert second == pytest.approx((0.090 + 0.150 + 0.095 + 0.150) / 4)
    assert r.trial_mean(20, 20.150) is None  # not measured
    r.exclude(0.050)  # planning inside the current iteration is not the plan's time
    assert r.trial_mean(11, 20.150) == pytest.approx(0.100)
    r.trials = [("plan-a", "ddp", first), ("plan-b", "dear", second)]
    assert r.after_trials(1, "warm-up") == ("plan-a", False)
    assert r.tried == {"dear"}  # the kept policy stays eligible when the plan is made again


def test_a_trial_is_timed_to_its_last_step_and_the_flush_of_what_it_deferred_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from commsched.runtime import switching
    from commsched.runtime.replan import Replanner

    clock = [10.400]
    monkeypatch.setattr(switching.time, "perf_counter", lambda: clock[0])

    class Engine:
        rank, flushed = 0, False

        def flush(self) -> None:  # the deferred all-reduce still in flight: half a second, unoverlapped
            self.flushed = True
            clock[0] += 0.5

    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.periods = {3: 0.100, 4: 0.100, 5: 0.100}
    r._last_start = (6, 10.300)
    engine = Engine()
    mean_s, end = switching.trial_mean_then_flush(engine, r, 3)  # type: ignore[arg-type]
    assert engine.flushed and end == 10.400 and clock[0] == pytest.approx(10.900)
    assert mean_s == pytest.approx(0.100)  # not (0.3 + 0.6) / 4: the flush is no iteration's time
    engine.rank = 1
    assert switching.trial_mean_then_flush(engine, r, 3)[0] is None  # only rank 0 measures


def test_one_fast_warm_up_iteration_gets_the_warm_ups_plan_measured_like_the_trials_not_kept_outright() -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.periods = {1: 0.300}
    r.trials = [("plan-a", "dear", 0.5), ("plan-b", "ddp", 0.4)]
    assert r.after_trials(1, "warm-up") == ("warm-up", True) and r.tried == set()  # measure it first
    r.trials.append(("warm-up", "no_overlap", 0.45))  # measured like the others: slower than the runner-up
    assert r.after_trials(1, "warm-up") == ("plan-b", False) and r.tried == {"dear", "no_overlap"}
    r.trials[-1] = ("warm-up", "no_overlap", 0.35)
    assert r.after_trials(1, "warm-up") == ("warm-up", False)  # faster when measured alike: kept
    r.trials = [("warm-up", "no_overlap", 0.5), ("plan-b", "ddp", 0.4)]  # the warm-up's plan was a trial
    assert r.after_trials(1, "warm-up") == ("plan-b", False)  # nothing more to measure


def test_the_kept_policy_stays_eligible_when_a_trial_measured_it_with_other_knobs() -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials = [("ddp-tuned", "ddp", 0.40), ("dear-plan", "dear", 0.45), ("ddp-defaults", "ddp", 0.42)]
    assert r.after_trials(1, "warm-up") == ("ddp-tuned", False) and r.tried == {"dear"}


def test_the_reference_trial_is_kept_unless_another_measured_faster_by_the_margin() -> None:
    from commsched.runtime.replan import REFERENCE_MARGIN, Replanner, choose

    near, far = 0.100 * (1 - REFERENCE_MARGIN) + 1e-4, 0.100 * (1 - REFERENCE_MARGIN) - 1e-4
    assert choose([near, 0.2, 0.100], None, 0.05, reference=2) == 2  # the fastest, but within the margin
    assert choose([far, 0.2, 0.100], None, 0.05, reference=2) == 0  # faster by more than the margin
    assert choose([near, 0.2, 0.100], None, 0.05) == 0  # no reference: the fastest
    assert choose([near, 0.2, None], None, 0.05, reference=2) == 0  # the reference unmeasured: no part
    assert choose([near, 0.2, 0.100], 0.05, 0.05, reference=2) is None  # all slower than the warm-up
    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials, r.reference = [("plan-a", "ps", near), ("plan-b", "dear", 0.2), ("plan-c", "ddp", 0.100)], 2
    assert r.after_trials(1, "warm-up") == ("plan-c", False) and r.tried == {"ps", "dear"}


@pytest.mark.parametrize(
    ("second", "kept"),
    [(0.47, "plan-c"), (0.41, "plan-a"), (None, "plan-a")],
    ids=["slower the second time: the reference", "as fast again: kept", "unmeasured: the first reading stands"],
)
def test_the_fastest_trial_is_measured_again_and_its_second_reading_decides(second: float | None, kept: str) -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials, r.reference = [("plan-a", "ps", 0.40), ("plan-b", "dear", 0.45), ("plan-c", "ddp", 0.46)], 2
    assert r.after_trials(1, "warm-up") == ("plan-a", False)  # not asked to: kept on its one reading
    r.tried.clear()
    assert r.after_trials(1, "warm-up", again=True) == ("plan-a", True) and r.again_of == 0
    r.measured_again(second)
    assert r.again == (0, second) and r.again_of is None
    assert r.readings() == [0.40 if second is None else second, 0.45, 0.46]
    # slower the second time: dear (0.45) is now the fastest, within the margin of the reference (0.46)
    assert r.after_trials(1, "warm-up", again=True) == (kept, False)  # measured again once at most
    assert r.tried == ({"ps", "dear"} if kept == "plan-c" else {"dear", "ddp"})


def test_no_trial_is_measured_again_where_the_reference_or_the_only_reading_is_the_fastest() -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials, r.reference = [("plan-a", "ps", 0.45), ("plan-c", "ddp", 0.44)], 1
    assert r.after_trials(1, "warm-up", again=True) == ("plan-c", False) and r.again_of is None
    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials = [("plan-a", "ps", 0.45), ("plan-b", "dear", None)]
    assert r.after_trials(1, "warm-up", again=True) == ("plan-a", False) and r.again_of is None


def test_a_trial_that_ran_a_policy_at_the_reference_plans_knobs_counts_as_the_reference() -> None:
    from commsched import zoo
    from commsched.runtime.replan import Replanner
    from commsched.runtime.switching import measured_as
    from commsched.schedule import NetworkEstimate, build_plan, reference_plan

    workload, network = zoo.load("resnet18"), NetworkEstimate(2, 1.25e8)
    reference = reference_plan(workload, network)
    tuned = build_plan(reference.policy, workload, network, bucket_cap_mb=1.0).to_json(indent=None)
    other = build_plan("dear", workload, network).to_json(indent=None)
    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.trials = [(tuned, reference.policy, 0.40), (other, "dear", 0.45)]
    assert measured_as(r, reference) is None  # the same policy at other knobs is not the reference
    r.trials.append((build_plan(reference.policy, workload, network).to_json(indent=None), reference.policy, 0.41))
    assert measured_as(r, reference) == 2


def test_pushes_and_pulls_count_the_bytes_a_reduce_scatter_or_all_gather_would_send() -> None:
    from commsched.runtime.replan import Replanner

    r = Replanner(DriftPolicy(), world=4, measures=True)
    assert r.monitor is not None
    r.transfer_done("push", 4000, 1.0)
    r.transfer_done("pull", 4000, 1.0)
    r.transfer_done("reduce_scatter", 4000, 1.0)
    assert r.monitor.transfer_bytes == pytest.approx(3 * 3000) and r.monitor.transfer_s == 3.0


def test_auto_measures_the_reference_where_the_search_ranks_the_warm_ups_plan_first() -> None:
    """The warm-up's plan (no-overlap) ranked first by the search is a candidate's trial, not the last resort
    that ends the trials: the reference (DDP's schedule at its defaults) is still measured after it."""
    from types import SimpleNamespace

    from commsched import zoo
    from commsched.runtime.replan import Replanner
    from commsched.runtime.switching import AutoPlanner, _next_trial
    from commsched.schedule import CommPlan, NetworkEstimate, build_plan, provisional_plan, reference_plan

    workload, network = zoo.load("resnet18"), NetworkEstimate(2, 1.25e8)
    warmup_plan = provisional_plan(workload, network)
    runner_up = build_plan("dear", workload, network)

    class Ranked(AutoPlanner):  # the search's answers, fixed: no-overlap first, DeAR the runner-up, no near-tie
        def __call__(self, workload: object, network: object, exclude: frozenset[str]) -> CommPlan:
            return runner_up if warmup_plan.policy in exclude else warmup_plan

        def near_tie(self, workload: object, network: object, measured: frozenset[str]) -> CommPlan | None:
            return None

        def reference(self, workload: object, network: object) -> CommPlan | None:
            return reference_plan(workload, network)

    engine = SimpleNamespace(planner=Ranked(5.0, None), _plan_inputs=(workload, network), _baseline_iteration=1)
    r = Replanner(DriftPolicy(), world=2, measures=True)
    r.periods = {1: 0.100}
    warmup_json = warmup_plan.to_json(indent=None)
    sequence = []
    current, mean_s = warmup_json, 0.100
    for _ in range(4):
        engine.plan = CommPlan.from_json(current, "a trial's plan")
        plan, measure = _next_trial(engine, r, current, mean_s, warmup_json)
        if not measure:
            break
        sequence.append(CommPlan.from_json(plan, "the next trial").policy)
        current, mean_s = plan, 0.100
    assert sequence[:2] == ["dear", reference_plan(workload, network).policy]
    assert r.reference == 2 and not r.fell_back
