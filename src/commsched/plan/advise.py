"""``advise``: the search of :mod:`commsched.plan.search` on a cluster as it is, every policy ranked."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from commsched.cluster import Cluster
from commsched.plan.search import Candidate, OptionsFor, Progress, search_policies
from commsched.plan.tune import DEFAULTS_MARGIN
from commsched.schedule import CommPlan, make_knobs, policy_class
from commsched.schedule.base import PS_TRANSPORT
from commsched.sim.ideal import IdealResult, ideal
from commsched.sim.options import SimOptions
from commsched.workload import Workload


@dataclass(frozen=True)
class Advice:
    """What :func:`advise` found: every lossless policy ranked, the winner's plan and the overlap bound."""

    model: str
    cluster: str
    candidates: tuple[Candidate, ...]
    ideal: IdealResult
    seed: int
    simulations: int
    search_s: float
    budget_s: float
    budget_exhausted: bool

    @property
    def winner(self) -> Candidate:
        return self.candidates[0]

    @property
    def plan(self) -> CommPlan:
        """The winner's plan (``plan.save(path)``; ``parallelize(model, opt, plan=path)`` runs it)."""
        return self.winner.plan

    def parallelize_call(self) -> str:
        """The exact ``commsched.parallelize`` call for the winner (knobs that differ from the defaults)."""
        w = self.winner
        args = "".join(f", {k}={v!r}" for k, v in w.changed_knobs.items())
        return f"model, optimizer = commsched.parallelize(model, optimizer, policy={w.policy!r}{args})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "cluster": self.cluster,
            "winner": self.winner.policy,
            "parallelize": self.parallelize_call(),
            "candidates": [c.to_dict() for c in self.candidates],
            "ideal_iteration_ms": self.ideal.iteration_ms,
            "seed": self.seed,
            "simulations": self.simulations,
            "search_s": self.search_s,
            "budget_s": self.budget_s,
            "budget_exhausted": self.budget_exhausted,
        }


def advise(
    workload: Workload,
    cluster: Cluster,
    *,
    budget_s: float = 5.0,
    sim_options: SimOptions | Mapping[str, Any] | None = None,
    options_for: OptionsFor | None = None,
    progress: Progress | None = None,
    seed: int = 0,
    trials: int = 30,
    iterations: int = 20,
    warmup: int = 3,
    policies: Sequence[str] | None = None,
    defaults_margin: float = DEFAULTS_MARGIN,
) -> Advice:
    """Rank every lossless policy (or ``policies``), each with its knobs searched, by simulated iteration time.

    Every rank runs the workload's batch; buckets go by collective (the
    simulator's ``algorithm``). ``budget_s`` bounds the search's wall-clock time;
    ``Advice.search_s`` reports what it took and ``budget_exhausted`` whether the
    budget cut the knob search short (results are then no longer reproducible
    by seed alone). The overlap bound (:func:`commsched.sim.ideal.ideal`) comes
    with it: no lossless schedule beats it under the same cost model
    (``sim_options``). ``options_for``: per-candidate simulator options, and
    ``defaults_margin``: how much searched knobs must gain to replace a policy's defaults
    (:func:`search_policies`).

    >>> advice = advise(zoo.load("resnet50"), load_cluster("8xV100-10GbE"))  # doctest: +SKIP
    >>> advice.winner.policy, advice.parallelize_call()  # doctest: +SKIP
    """
    outcome = search_policies(
        workload,
        cluster,
        policies=policies,
        sim_options=sim_options,
        options_for=options_for,
        budget_s=budget_s,
        trials=trials,
        seed=seed,
        iterations=iterations,
        warmup=warmup,
        progress=progress,
        defaults_margin=defaults_margin,
    )
    return Advice(
        model=workload.model,
        cluster=cluster.name,
        candidates=outcome.candidates,
        ideal=overlap_bound(workload, cluster, sim_options, [(c.policy, c.knobs) for c in outcome.candidates]),
        seed=seed,
        simulations=outcome.simulations,
        search_s=outcome.search_s,
        budget_s=budget_s,
        budget_exhausted=outcome.budget_exhausted,
    )


def overlap_bound(
    workload: Workload,
    cluster: Cluster,
    sim_options: SimOptions | Mapping[str, Any] | None,
    candidates: Sequence[tuple[str, Mapping[str, Any]]],
) -> IdealResult:
    """The overlap bound of :func:`commsched.sim.ideal.ideal` over the candidates, (policy, knobs) pairs: under
    the options' collective algorithm, and where a candidate's tasks run on the ``"ps"`` transport (priced by the
    parameter server's model whatever the algorithm) the lower of that and the bound under ``algorithm="ps"``. At
    64 V100s on 10 GbE the ring's bound for ResNet-50 (177.9 ms) is above what ``ps`` is simulated to take
    (176.1 ms with its knobs searched), which the ring's bound alone would call impossible. Plans mixing both
    transports are not among the candidates."""
    bound = ideal(workload, cluster, sim_options)
    over_ps = any(PS_TRANSPORT in policy_class(p).transports(make_knobs(p, k)) for p, k in candidates)
    if not over_ps:
        return bound
    options = dataclasses.replace(SimOptions.from_mapping(sim_options), algorithm="ps")
    return min(bound, ideal(workload, cluster, options), key=lambda b: b.iteration_ms)
