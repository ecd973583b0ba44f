"""Search a policy's knobs by simulation (optuna's TPE sampler, seeded, quiet, bounded trials).

Numeric knobs with a default are searched on a log scale: sizes in MiB
(``*_mb``) over [1/4, 512], times in ms (``*_ms``) over [0.05, 20], factors
over [1, 8], other positive numbers over [default/16, default·16]. Knobs
whose default is ``None`` or 0 (overrides and switches such as
``bandwidth_gbps``, ``slack_ms``, ``bucket_cap_mb`` of ``no_overlap``) keep
their default. The defaults are always tried first, so the result is never
worse than them under the search's iteration count, and searched knobs are
kept only when they beat the defaults by more than :data:`DEFAULTS_MARGIN`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import CommschedError
from commsched.schedule import knobs as policy_knobs
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
from commsched.sim.simulator import simulate
from commsched.workload import Workload

#: Searched knobs are kept only when their simulated iteration time beats the defaults' by more than this
#: fraction (the default of :func:`commsched.plan.search.search_policies`): a smaller gain is below what the
#: simulator resolves on a real testbed, where its error differs between two settings of one policy by a few
#: percent (2 workers, resnet5m, unshaped: ddp[4MiB] and ddp[25MiB] predicted -6.2 % and -3.4 % off,
#: BENCHMARKS.md). ``auto`` asks for more (:data:`commsched.runtime.switching.KNOB_MARGIN`).
DEFAULTS_MARGIN = 0.02


def beats_defaults(tuned_ms: float, default_ms: float, margin: float = DEFAULTS_MARGIN) -> bool:
    """Whether searched knobs simulating ``tuned_ms`` are worth keeping over defaults simulating ``default_ms``."""
    return tuned_ms < default_ms * (1 - margin)


def search_space(policy: str) -> dict[str, tuple[float, float]]:
    """The knobs that are searched, with their (low, high) log-scale ranges (whole-number knobs: ints)."""
    space: dict[str, tuple[float, float]] = {}
    for name, default in policy_knobs(policy).items():
        if isinstance(default, bool) or not isinstance(default, int | float) or default <= 0:
            continue
        if name.endswith("_mb"):
            space[name] = (0.25, 512.0)
        elif name.endswith("_ms"):
            space[name] = (0.05, 20.0)
        elif "factor" in name:
            space[name] = (1.0, 8.0)
        elif isinstance(default, int):  # a count, e.g. DeAR's look-ahead in groups
            space[name] = (1, max(16, default * 16))
        else:
            space[name] = (default / 16, default * 16)
    return space


@dataclass(frozen=True)
class TuneResult:
    policy: str
    best_knobs: dict[str, Any]
    best: SimResult
    default: SimResult
    trials: int

    @property
    def gain(self) -> float:
        """Speed-up of the best knobs over the defaults (1.25 = 25 % faster)."""
        return self.default.iteration_ms / self.best.iteration_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "trials": self.trials,
            "best_knobs": self.best_knobs,
            "best_iteration_ms": self.best.iteration_ms,
            "default_iteration_ms": self.default.iteration_ms,
            "gain": self.gain,
        }


def tune(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    trials: int = 30,
    iterations: int = 20,
    warmup: int = 3,
    seed: int = 0,
    options: SimOptions | Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    **fixed: Any,
) -> TuneResult:
    """Minimise the simulated iteration time over the policy's numeric knobs.

    ``fixed`` knobs are not searched. Trials simulate ``max(4, iterations // 4)``
    steady iterations without a trace; the best knobs and the defaults are
    then simulated with ``iterations``. A knob setting the policy rejects
    (a ScheduleError, say) counts as a failed trial. ``progress(done)`` is
    called after each trial with the number of trials done.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {k: v for k, v in search_space(policy).items() if k not in fixed}
    defaults = {k: v for k, v in policy_knobs(policy).items() if k in space}
    quick = max(4, iterations // 4)

    def objective(trial: optuna.Trial) -> float:
        knobs: dict[str, Any] = {
            name: trial.suggest_int(name, int(lo), int(hi), log=True)
            if isinstance(lo, int)
            else trial.suggest_float(name, lo, hi, log=True)
            for name, (lo, hi) in space.items()
        }
        try:
            result = simulate(
                workload, cluster, policy, quick, min(warmup, 2), options=options, trace=False, **fixed, **knobs
            )
        except CommschedError:
            return math.inf
        return result.iteration_ms

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if space:
        study.enqueue_trial({k: min(max(v, space[k][0]), space[k][1]) for k, v in defaults.items()})
        callbacks = [lambda study, _trial: progress(len(study.trials))] if progress is not None else None
        study.optimize(objective, n_trials=trials, callbacks=callbacks)
        best_knobs = dict(study.best_params) if math.isfinite(study.best_value) else {}
    else:
        best_knobs = {}
    default = simulate(workload, cluster, policy, iterations, warmup, options=options, **fixed)
    best = simulate(workload, cluster, policy, iterations, warmup, options=options, **fixed, **best_knobs)
    if not beats_defaults(best.iteration_ms, default.iteration_ms):
        best, best_knobs = default, {}
    return TuneResult(policy, {**fixed, **best_knobs}, best, default, trials if space else 0)


class KnobSearch:
    """An ask/tell knob search for one policy: its defaults first, then optuna's TPE sampler (seeded).

    ``ask()`` returns the next knob values to try (only the searched ones,
    :func:`search_space`; numbers rounded to 3 significant digits); ``tell(iteration_ms)`` reports how they did
    (``math.inf`` for a setting that was refused). A policy with nothing to
    search is not ``searchable``: its one trial is its defaults.
    """

    __slots__ = ("_pending", "_space", "_study", "asked")

    def __init__(self, policy: str, seed: int = 0) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._space = search_space(policy)
        self._study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
        defaults = {k: v for k, v in policy_knobs(policy).items() if k in self._space}
        if self._space:
            self._study.enqueue_trial(
                {k: min(max(v, self._space[k][0]), self._space[k][1]) for k, v in defaults.items()}
            )
        self._pending: Any = None
        self.asked = 0

    @property
    def searchable(self) -> bool:
        return bool(self._space)

    def ask(self) -> dict[str, Any]:
        self.asked += 1
        if not self._space:
            return {}
        trial = self._study.ask()
        self._pending = trial
        return {
            name: trial.suggest_int(name, int(lo), int(hi), log=True)
            if isinstance(lo, int)
            else float(f"{trial.suggest_float(name, lo, hi, log=True):.3g}")  # what a person would type
            for name, (lo, hi) in self._space.items()
        }

    def tell(self, iteration_ms: float) -> None:
        if self._pending is not None:
            self._study.tell(self._pending, iteration_ms if math.isfinite(iteration_ms) else 1e30)
            self._pending = None
