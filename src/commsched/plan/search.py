"""One plan search over policies, knobs and per-bucket sync, every candidate scored by the simulator.

:func:`search_policies` is the search; :func:`commsched.plan.advise.advise` runs it on a cluster as
it is (every rank the workload's batch) and :func:`commsched.plan.hetero.plan_heterogeneous`
runs it on per-rank batch splits of a heterogeneous cluster. What it searches:

* **policy**: every lossless policy (:data:`commsched.schedule.LOSSLESS`). The
  policy also fixes the bucket order: ``ddp``/``wfbp``/``horovod`` launch in
  gradient-ready order, ``bytescheduler``/``prophet``/``dear`` by layer priority.
* **knobs**: the policy's numeric knobs (:func:`commsched.plan.tune.search_space`),
  defaults first, then optuna's TPE sampler, seeded per policy; one trial per
  policy per round, round after round, until ``trials`` rounds or the budget.
* **sync** (when the cluster lists parameter servers and ``syncs`` asks for it):
  every bucket by collective (``"collective"``), every bucket by PS (``"ps"``), or
  each bucket by whichever of the two costs less alone on the network
  (``"cheaper"``). A bucket sent by PS is a task whose ``transport`` is ``"ps"``;
  the simulator prices it under the ``ps`` cost model.

Trials simulate ``max(2, iterations // 4)`` iterations after 2 warm-up ones
without a trace; the best policies' best trials are then simulated with
``iterations`` (and their defaults too: the searched knobs are kept only when
they beat the defaults by more than ``defaults_margin``, 2 % unless asked). The budget is a
hard bound on wall-clock time (:class:`~commsched.plan.budget.Budget`): a
simulation starts only when its estimated cost, plus the final simulations'
reserved, ends before the deadline; what does not fit is skipped, and the
result says so (``budget_exhausted``). The search is deterministic for a
seed as long as the budget is not reached.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import CommschedError, ScheduleError
from commsched.plan.budget import Budget
from commsched.plan.tune import DEFAULTS_MARGIN, KnobSearch, beats_defaults
from commsched.schedule import LOSSLESS, CommPlan
from commsched.schedule import knobs as policy_knobs
from commsched.schedule.base import COLLECTIVE, PS_TRANSPORT
from commsched.sim.costs import CommModel
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
from commsched.sim.simulator import plan_for, simulate_plan
from commsched.workload import Workload

#: How buckets are synchronised: all by collective, all by parameter server, or each by the cheaper one.
SYNC_MODES: tuple[str, ...] = ("collective", "ps", "cheaper")

#: Called after each simulation with (what was simulated, simulations done so far).
Progress = Callable[[str, int], None]

#: The simulator options of one candidate, from its policy and knobs.
OptionsFor = Callable[[str, Mapping[str, Any]], SimOptions]


class Simulated:
    """What a search result reads off its simulation (``result``): the plan and its predicted speed."""

    result: SimResult

    @property
    def iteration_ms(self) -> float:
        return self.result.iteration_ms

    @property
    def samples_per_s(self) -> float:
        return self.result.samples_per_s

    @property
    def plan(self) -> CommPlan:
        assert self.result.plan is not None
        return self.result.plan


@dataclass(frozen=True)
class Candidate(Simulated):
    """One policy's best setting found: its knobs (all of them), sync mode and simulated result."""

    policy: str
    knobs: dict[str, Any]
    sync: str
    trials: int
    result: SimResult = field(repr=False)
    #: steady iterations its result simulated: the search's ``iterations``, or fewer for a trial's result
    iterations: int = 0

    @property
    def changed_knobs(self) -> dict[str, Any]:
        """The knobs that differ from the policy's defaults."""
        defaults = policy_knobs(self.policy)
        return {k: v for k, v in self.knobs.items() if defaults.get(k) != v}

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "knobs": self.knobs,
            "sync": self.sync,
            "trials": self.trials,
            "iteration_ms": self.iteration_ms,
            "samples_per_s": self.samples_per_s,
            "exposed_comm_ms": self.result.exposed_comm_ms,
            "simulated_iterations": self.iterations,
        }


@dataclass(frozen=True)
class SearchOutcome:
    """Candidates best first (one per policy), and how the search went."""

    candidates: tuple[Candidate, ...]
    simulations: int
    search_s: float
    budget_s: float
    budget_exhausted: bool


def with_sync(plan: CommPlan, sync: str, cluster: Cluster, options: SimOptions) -> CommPlan:
    """``plan`` with each task's transport set by ``sync`` (:data:`SYNC_MODES`).

    ``"cheaper"`` compares a task's cost alone on the network under the
    collective model (``options.algorithm``) and the PS model. An all-gather or
    pull follows the transport of the task it depends on, so the two halves of a
    reduction go the same way. A plan whose policy chose its own transports
    (``ps``, ``dlcp``) is returned as it is. Raises ScheduleError for an unknown mode, and for
    ``"ps"``/``"cheaper"`` on a cluster without parameter servers.
    """
    if sync not in SYNC_MODES:
        raise ScheduleError(f"plan: unknown sync {sync!r}; known: {', '.join(SYNC_MODES)}")
    if sync == "collective" or any(t.transport != COLLECTIVE for t in plan.tasks):
        return plan  # the collectives as they are, or a policy that chose its own transports
    if cluster.servers is None:
        raise ScheduleError(f"plan: sync {sync!r} needs parameter servers; cluster {cluster.name} has none")
    ring = CommModel.from_cluster(cluster, options.algorithm)
    ps = CommModel.from_cluster(cluster, "ps")
    transports = []
    for task in plan.tasks:
        if sync == "ps":
            transports.append(PS_TRANSPORT)
        elif task.kind in ("all_gather", "pull") and task.deps:
            transports.append(transports[task.deps[0]])
        else:
            cheaper = ps.cost_s(task.kind, task.bytes) < ring.cost_s(task.kind, task.bytes)
            transports.append(PS_TRANSPORT if cheaper else COLLECTIVE)
    tasks = tuple(dataclasses.replace(t, transport=tr) for t, tr in zip(plan.tasks, transports, strict=True))
    return dataclasses.replace(plan, tasks=tasks)


def simulate_candidate(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    knobs: Mapping[str, Any] | None = None,
    *,
    sync: str = "collective",
    batch_sizes: Sequence[int] | None = None,
    options: SimOptions | Mapping[str, Any] | None = None,
    iterations: int = 20,
    warmup: int = 3,
    trace: bool = False,
) -> SimResult:
    """Simulate one candidate: ``policy`` with ``knobs``, buckets synchronised by ``sync``, per-rank ``batch_sizes``.

    The same as :func:`commsched.sim.simulate` for ``sync="collective"``; the plan
    of the result carries each task's transport.
    """
    plan = with_sync(
        plan_for(workload, cluster, policy, options, **dict(knobs or {})),
        sync,
        cluster,
        SimOptions.from_mapping(options),
    )
    return simulate_plan(plan, cluster, iterations, warmup, options=options, trace=trace, batch_sizes=batch_sizes)


def search_policies(
    workload: Workload,
    cluster: Cluster,
    *,
    policies: Sequence[str] | None = None,
    syncs: Sequence[str] = ("collective",),
    batch_sizes: Sequence[int] | None = None,
    sim_options: SimOptions | Mapping[str, Any] | None = None,
    options_for: OptionsFor | None = None,
    budget_s: float = 5.0,
    trials: int = 30,
    seed: int = 0,
    iterations: int = 20,
    warmup: int = 3,
    progress: Progress | None = None,
    budget: Budget | None = None,
    top: int | None = None,
    finals: int | None = None,
    defaults_margin: float = DEFAULTS_MARGIN,
) -> SearchOutcome:
    """The search of the module docstring; candidates ranked by simulated iteration time (ties: policy name).

    ``options_for(policy, knobs)``: the simulator options of each candidate (e.g. the runtime on gloo,
    :func:`commsched.plan.gloo.gloo_options`), instead of ``sim_options`` for all.
    ``budget`` (default: a new one of ``budget_s``) is shared when several searches make one plan: no
    simulation starts unless it is expected to end before its deadline (:mod:`commsched.plan.budget`).
    ``top``: how many policies, best by their defaults, get the knob search (default: all).
    ``finals``: how many candidates, best first, are simulated with ``iterations`` (default: all); the
    others keep their trial's result (``Candidate.iterations`` says which).
    ``defaults_margin``: searched knobs replace a finalist's defaults only when they simulate faster by
    more than this fraction of the defaults' time (:data:`~commsched.plan.tune.DEFAULTS_MARGIN`).
    """
    if budget is None:
        if budget_s <= 0 or not math.isfinite(budget_s):
            raise ScheduleError(f"plan: budget_s must be a finite number > 0, got {budget_s!r}")
        budget = Budget(budget_s)
    if trials < 1:
        raise ScheduleError(f"plan: trials must be >= 1, got {trials}")
    if not 0 <= defaults_margin < 1:
        raise ScheduleError(f"plan: defaults_margin must be in [0, 1), got {defaults_margin!r}")
    names = sorted(LOSSLESS if policies is None else policies)
    opts = SimOptions.from_mapping(sim_options)
    start = time.perf_counter()
    quick = max(2, iterations // 4)
    quick_total, full_total = (quick + 2) * len(syncs), iterations + warmup
    done = 0
    exhausted = False

    def run(
        policy: str, knobs: Mapping[str, Any], sync: str, n: int, w: int, interruptible: bool = True
    ) -> SimResult | None:
        nonlocal done

        options = opts if options_for is None else options_for(policy, knobs)

        def simulate() -> SimResult | None:
            try:
                return simulate_candidate(
                    workload, cluster, policy, knobs, sync=sync, batch_sizes=batch_sizes, options=options,
                    iterations=n, warmup=w,
                )  # fmt: skip
            except CommschedError:
                return None

        result = budget.run(policy, n + w, simulate, interruptible=interruptible)
        done += 1
        if progress is not None:
            progress(f"{policy} ({sync})", done)
        return result

    def trial(policy: str, knobs: Mapping[str, Any], interruptible: bool = True) -> tuple[float, str, SimResult | None]:
        best: tuple[float, str, SimResult | None] = (math.inf, syncs[0], None)
        for sync in syncs:
            result = run(policy, knobs, sync, quick, 2, interruptible)
            if result is not None and result.iteration_ms < best[0]:
                best = (result.iteration_ms, sync, result)
        return best

    n_finals = len(names) if finals is None else min(finals, len(names))

    def changed(policy: str, knobs: Mapping[str, Any]) -> bool:
        return any(v != policy_knobs(policy)[k] for k, v in knobs.items())

    def reserve_s() -> float:
        """The final simulations of the best candidates so far, each policy at its own cost (defaults too when
        its knobs changed), and one more in case a knob trial changes a candidate's knobs."""
        leaders = sorted(best, key=lambda p: (best[p][0], p))[:n_finals]
        return sum(budget.estimate_s(p, full_total) * (1 + changed(p, best[p][1])) for p in leaders) + max(
            (budget.estimate_s(p, full_total) for p in leaders), default=0.0
        )

    searches = {p: KnobSearch(p, seed=seed + i) for i, p in enumerate(names)}
    best: dict[str, tuple[float, dict[str, Any], str, SimResult | None]] = {}
    counts = dict.fromkeys(names, 0)
    # round 0: every policy's defaults; the first policy's always run (a search returns at least one candidate)
    for p in names:
        if best and not budget.fits(p, quick_total):
            exhausted = True
            budget.skipped += 1
            continue
        knobs = searches[p].ask()
        value, sync, result = trial(p, knobs, interruptible=bool(best))  # the first is the floor
        searches[p].tell(value)
        counts[p] += 1
        best[p] = (value, knobs, sync, result)
    ranked = sorted(best, key=lambda p: (best[p][0], p))
    searched = ranked if top is None else ranked[:top]
    for _ in range(1, trials):
        open_ = [p for p in searched if searches[p].searchable]
        if not open_ or exhausted:
            break
        for p in open_:
            if not budget.fits(p, quick_total, reserve_s()):
                exhausted = True
                budget.skipped += 1
                break
            knobs = searches[p].ask()
            value, sync, result = trial(p, knobs)
            searches[p].tell(value)
            counts[p] += 1
            if value < best[p][0]:
                best[p] = (value, knobs, sync, result)

    candidates = []
    for rank, p in enumerate(sorted(best, key=lambda p: (best[p][0], p))):
        value, knobs, sync, quick_result = best[p]
        if not math.isfinite(value) or quick_result is None:
            continue  # every setting tried was refused by the policy or the simulator
        final: SimResult | None = None
        knobs_changed = changed(p, knobs)
        if rank < n_finals and budget.fits(p, full_total * (2 if knobs_changed else 1)):
            final = run(p, knobs, sync, iterations, warmup)
            default = run(p, {}, sync, iterations, warmup) if knobs_changed else None
            tuned_ms = math.inf if final is None else final.iteration_ms
            if default is not None and not beats_defaults(tuned_ms, default.iteration_ms, defaults_margin):
                final, knobs = default, {}
        elif rank < n_finals:
            exhausted = True
            budget.skipped += 1
        result, simulated = (final, iterations) if final is not None else (quick_result, quick)
        full = {**policy_knobs(p), **knobs}
        candidates.append(Candidate(p, full, sync, counts[p], result, simulated))
    candidates.sort(key=lambda c: (c.iteration_ms, c.policy))
    exhausted = exhausted or budget.skipped > 0
    if not candidates:
        raise ScheduleError(f"plan: no policy could be simulated for {workload.model} on {cluster.name}")
    return SearchOutcome(tuple(candidates), done, time.perf_counter() - start, budget.budget_s, exhausted)
