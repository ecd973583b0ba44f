"""The search budget is a hard bound: nothing starts that is not expected to end in time, beyond the floor."""

from __future__ import annotations

import contextlib
import sys
import time

import pytest

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.plan import search_policies
from commsched.plan.budget import GRACE_S, SAFETY, Budget
from commsched.plan.hetero import plan_heterogeneous
from commsched.schedule import LOSSLESS


def test_the_budget_estimates_each_policy_by_its_mean_iteration_and_refuses_what_would_end_late() -> None:
    budget = Budget(3600.0)
    assert budget.estimate_s("ddp", 10) == 0.0  # nothing seen yet
    budget.run("ddp", 4, lambda: time.sleep(0.04))
    per_iteration = budget.estimate_s("ddp", 1) / SAFETY
    assert 0.01 <= per_iteration < 0.05
    assert budget.estimate_s("wfbp", 10) == pytest.approx(10 * per_iteration * SAFETY)  # unseen: the slowest seen
    budget.run("ddp", 4, lambda: None)  # a cheaper run of the same policy lowers its mean
    assert budget.estimate_s("ddp", 1) < per_iteration * SAFETY
    assert budget.fits("ddp", 10) and not budget.fits("ddp", 10, reserve_s=3600.0)
    share = budget.share(10.0)
    assert share.deadline <= budget.deadline and share.estimate_s("ddp", 1) == budget.estimate_s("ddp", 1)
    assert Budget(1.0).share(100.0).deadline <= time.perf_counter() + 1.0


def test_a_simulation_still_running_past_the_deadline_is_interrupted_and_dropped() -> None:
    budget = Budget(0.2)
    began = time.perf_counter()
    assert budget.run("slow", 1, lambda: time.sleep(30) or "done") is None
    assert time.perf_counter() - began < 0.2 + GRACE_S + 1.0 and budget.skipped == 1
    assert budget.run("slow", 1, lambda: "late") is None  # past the deadline: not even started
    assert budget.run("floor", 1, lambda: "kept", interruptible=False) == "kept"


def test_an_interruption_dropped_by_the_simulation_is_raised_again_until_it_ends() -> None:
    def drops_the_first() -> str:  # as a finalizer or a weakref callback that the alarm hits would
        with contextlib.suppress(Exception):
            time.sleep(30)
        time.sleep(30)
        return "done"

    budget = Budget(0.1)
    began = time.perf_counter()
    assert budget.run("slow", 1, drops_the_first) is None and budget.skipped == 1
    assert time.perf_counter() - began < 0.1 + 2 * GRACE_S + 1.0
    time.sleep(3 * GRACE_S)  # the alarm stopped with the simulation: nothing is raised here


def test_an_interruption_in_a_finalizer_is_dropped_unprinted_and_other_reports_are_not_interrupted() -> None:
    """The alarm hits a finalizer (Python reports what it raises through ``sys.unraisablehook``), then another
    finalizer's error takes the test's hook several repetitions of the alarm to report: the interruption is
    dropped without a report, the report completes, and the simulation still ends at the deadline."""
    seen: list[tuple[type[BaseException], float]] = []

    def slow_report(unraisable: sys.UnraisableHookArgs) -> None:
        time.sleep(6 * GRACE_S)  # the alarm repeats meanwhile
        seen.append((unraisable.exc_type, time.perf_counter()))

    class SpinsUntilInterrupted:
        def __del__(self) -> None:
            while True:
                time.sleep(GRACE_S / 10)

    class Fails:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own error")

    def simulate() -> str:
        SpinsUntilInterrupted()  # dropped at once: its finalizer runs until the alarm interrupts it
        Fails()
        time.sleep(30)
        return "done"

    hook = sys.unraisablehook
    sys.unraisablehook = slow_report
    try:
        budget = Budget(0.1)
        began = time.perf_counter()
        assert budget.run("slow", 1, simulate) is None and budget.skipped == 1
        ended = time.perf_counter()
    finally:
        sys.unraisablehook = hook
    assert [kind for kind, _ in seen] == [ValueError]  # reported once, in full; the interruption not at all
    assert seen[0][1] - began >= 6 * GRACE_S and ended - began < 0.1 + 10 * GRACE_S + 1.0


def test_a_budget_too_small_for_anything_runs_only_the_floor_and_says_so() -> None:
    plan = plan_heterogeneous(zoo.load("resnet18"), load_cluster("hetero-16"), budget_s=1e-3)
    assert plan.budget_exhausted
    assert plan.simulations == len(plan.baselines) + 1  # the baselines, the first policy's defaults on the best split
    assert plan.iteration_ms <= plan.baseline("even_allreduce").iteration_ms * (1 + 1e-9)


def test_only_the_best_candidates_get_final_simulations() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("hetero-8")
    outcome = search_policies(workload, cluster, trials=1, budget_s=60, finals=2, iterations=8)
    assert len(outcome.candidates) == len(LOSSLESS) and not outcome.budget_exhausted
    assert [c.iterations for c in outcome.candidates[:2]] == [8, 8]
    assert {c.iterations for c in outcome.candidates[2:]} == {2}  # their trial's result: max(2, 8 // 4)
