"""``advise``: every lossless policy, knobs searched, ranked by the simulator, within a budget."""

from __future__ import annotations

import pytest

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.errors import ScheduleError
from commsched.plan import advise, search_policies
from commsched.plan.tune import DEFAULTS_MARGIN
from commsched.schedule import LOSSLESS
from commsched.sim import simulate


def test_advise_picks_what_the_simulator_ranks_first_when_candidates_are_simulated_independently() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("8xV100-10GbE")
    advice = advise(workload, cluster, trials=4, budget_s=30)
    assert {c.policy for c in advice.candidates} == set(LOSSLESS)
    again = {c.policy: simulate(workload, cluster, c.policy, trace=False, **c.knobs) for c in advice.candidates}
    times = {p: r.iteration_ms for p, r in again.items()}
    for c in advice.candidates:
        assert abs(times[c.policy] - c.iteration_ms) <= 1e-9 * c.iteration_ms
    assert min(times, key=lambda p: (times[p], p)) == advice.winner.policy
    assert advice.plan.policy == advice.winner.policy
    assert f"policy={advice.winner.policy!r}" in advice.parallelize_call()


def test_advise_never_beats_the_overlap_bound() -> None:
    advice = advise(zoo.load("resnet18"), load_cluster("8xV100-10GbE"), trials=2)
    assert all(c.iteration_ms >= advice.ideal.iteration_ms * (1 - 1e-9) for c in advice.candidates)


def test_advise_is_deterministic_for_a_seed() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("8xV100-10GbE")
    first = advise(workload, cluster, trials=5, seed=3, budget_s=60)
    second = advise(workload, cluster, trials=5, seed=3, budget_s=60)
    assert not first.budget_exhausted
    assert [(c.policy, c.knobs, c.iteration_ms) for c in first.candidates] == [
        (c.policy, c.knobs, c.iteration_ms) for c in second.candidates
    ]


def test_advise_stops_its_knob_search_at_the_budget() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("8xV100-10GbE")
    floor = search_policies(workload, cluster, trials=1, budget_s=60).search_s  # defaults and final runs only
    budget = floor + 1.0
    advice = advise(workload, cluster, trials=100_000, budget_s=budget)
    assert advice.budget_exhausted
    assert advice.search_s <= budget + 0.5, (advice.search_s, budget)
    assert advice.simulations > len(LOSSLESS)


def test_searched_knobs_are_kept_only_when_they_beat_the_defaults_by_a_margin() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("8xV100-10GbE")
    tuned = search_policies(workload, cluster, trials=4, budget_s=60)
    changed = [c for c in tuned.candidates if c.changed_knobs]
    assert changed, "the search changed no policy's knobs on a 10 GbE cluster"
    for c in changed:
        defaults = simulate(workload, cluster, c.policy, trace=False).iteration_ms
        assert c.iteration_ms < defaults * (1 - DEFAULTS_MARGIN), (c.policy, c.iteration_ms, defaults)
    kept = search_policies(workload, cluster, trials=4, budget_s=60, defaults_margin=0.9)  # more than any gain
    assert [c.changed_knobs for c in kept.candidates] == [{}] * len(kept.candidates)
    with pytest.raises(ScheduleError, match="defaults_margin"):
        search_policies(workload, cluster, trials=1, defaults_margin=1.0)


def test_the_bound_holds_for_the_parameter_server_where_its_model_beats_the_rings_bound() -> None:
    """ResNet-50 on 64 V100s, 10 GbE: ``ps`` with its knobs searched is simulated below the ring's overlap bound,
    so the bound ``advise`` reports is the parameter server's there (the lower of the two)."""
    from dataclasses import replace

    from commsched.sim.ideal import ideal
    from commsched.sim.options import SimOptions

    workload, cluster = zoo.load("resnet50"), load_cluster("64xV100-10GbE")
    advice = advise(workload, cluster, policies=["ps"], trials=30, budget_s=120)
    (ps,) = advice.candidates
    ring = ideal(workload, cluster).iteration_ms
    assert ps.iteration_ms < ring  # the ring's bound alone would call it impossible
    assert advice.ideal.iteration_ms == ideal(workload, cluster, replace(SimOptions(), algorithm="ps")).iteration_ms
    assert ps.iteration_ms >= advice.ideal.iteration_ms * (1 - 1e-9)
