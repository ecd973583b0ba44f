"""Re-planning when the measured world drifts from the one a plan was made for (as Prophet does).

Rank 0 keeps measuring the compute time of each iteration (forward and
backward, minus the time spent waiting for communication) and the bandwidth
its transfers reach. The first window of ``every`` iterations after a plan is
adopted sets the baseline (measured the same way as what follows, so a
difference of definition cannot look like drift). Every ``every`` iterations
the engine asks :meth:`DriftMonitor.drifted` and sends rank 0's answer to
every rank, so all decide alike: when compute or bandwidth is off its
baseline by more than ``threshold`` (relative) in ``patience`` consecutive
windows (hysteresis: one noisy window does not switch), the plan is made
again with the workload and network scaled by what changed, and every rank
switches at the same iteration boundary. ``every`` is also the minimum
interval between two switches.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from commsched.formulas import sent_volume
from commsched.schedule import CommPlan, NetworkEstimate
from commsched.workload import Workload

log = logging.getLogger("commsched")


@dataclass(frozen=True)
class DriftPolicy:
    """When to re-plan: checks every ``every`` iterations, a ``threshold`` relative change, ``patience`` checks."""

    every: int = 20
    threshold: float = 0.25
    patience: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 2:
            raise ValueError(f"replan every: must be a whole number >= 2, got {self.every!r}")
        if not (isinstance(self.threshold, int | float) and 0 < self.threshold < 10):
            raise ValueError(f"replan threshold: must be a number in (0, 10), got {self.threshold!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(f"replan patience: must be a whole number >= 1, got {self.patience!r}")


@dataclass
class DriftMonitor:
    """Measurements since the last check, and the decision rule (no clock, no communication)."""

    policy: DriftPolicy
    baseline_compute_s: float | None = None
    baseline_bandwidth: float | None = None
    compute_s: list[float] = field(default_factory=list)
    transfer_bytes: float = 0.0
    transfer_s: float = 0.0
    strikes: int = 0

    def record_iteration(self, compute_s: float) -> None:
        self.compute_s.append(compute_s)

    def record_transfer(self, nbytes: float, seconds: float) -> None:
        """A transfer's bytes on the wire (per rank) and its duration."""
        if seconds > 0 and nbytes > 0:
            self.transfer_bytes += nbytes
            self.transfer_s += seconds

    def measured(self) -> tuple[float | None, float | None]:
        """Median compute per iteration and bandwidth since the last check (None where unmeasured)."""
        compute = statistics.median(self.compute_s) if self.compute_s else None
        bandwidth = self.transfer_bytes / self.transfer_s if self.transfer_s > 0 else None
        return compute, bandwidth

    def drifted(self) -> tuple[float, float] | None:
        """Close the window; after the ``patience``-th drifted window in a row, the factors
        ``(compute now / baseline, bandwidth now / baseline)`` to re-plan with (1.0 where unmeasured)."""
        compute, bandwidth = self.measured()
        self.compute_s, self.transfer_bytes, self.transfer_s = [], 0.0, 0.0
        if self.baseline_compute_s is None and self.baseline_bandwidth is None:
            self.baseline_compute_s, self.baseline_bandwidth = compute, bandwidth
            return None
        compute_factor = compute / self.baseline_compute_s if compute and self.baseline_compute_s else 1.0
        bandwidth_factor = bandwidth / self.baseline_bandwidth if bandwidth and self.baseline_bandwidth else 1.0
        off = max(abs(compute_factor - 1.0), abs(bandwidth_factor - 1.0)) > self.policy.threshold
        self.strikes = self.strikes + 1 if off else 0
        if self.strikes < self.policy.patience:
            return None
        self.strikes = 0
        self.baseline_compute_s = self.baseline_bandwidth = None  # the next window measures the new plan
        return compute_factor, bandwidth_factor


#: Iterations a plan runs in its trial after the one it is switched in at; their mean decides, each
#: from its start to the next (the last to the end of its step: :meth:`Replanner.trial_mean`).
TRIAL_ITERATIONS = 4
#: The warm-up's plan is measured as a trial of its own only when the fastest trial is slower than the last
#: warm-up iteration by more than this (relative).
TRIAL_MARGIN = 0.05
#: The reference trial (PyTorch DDP's schedule at its defaults) is kept unless the fastest trial measured
#: faster than it by more than this fraction. Four iterations of a trial vary by several percent, and with
#: five plans measured the fastest reading is partly luck: unshaped, ``auto`` kept plans whose trials had read
#: 142-148 ms and that then ran 150-154 ms, against 136 ms for the runtime's ``ddp`` (BENCHMARKS.md, "auto
#: keeps DDP's schedule unless another measures faster").
REFERENCE_MARGIN = 0.03


def choose(
    trials: list[float | None],
    baseline_s: float | None,
    margin: float,
    reference: int | None = None,
    reference_margin: float = REFERENCE_MARGIN,
) -> int | None:
    """Which measured plan to keep: the index of the fastest trial (mean seconds per iteration), or
    ``reference`` (a trial's index) where that measured within ``reference_margin`` of the fastest.

    None: the warm-up's plan may be faster, because even the fastest trial is
    slower than ``baseline_s`` (one warm-up iteration) by more than ``margin``.
    Trials without a measurement take no part; with none measured, the last one
    is kept (nothing says it is slow).
    """
    measured = [(t, i) for i, t in enumerate(trials) if t is not None]
    if not measured:
        return len(trials) - 1
    fastest, index = min(measured)
    if baseline_s is not None and fastest > baseline_s * (1 + margin):
        return None
    ref_s = trials[reference] if reference is not None and reference < len(trials) else None
    if ref_s is not None and ref_s * (1 - reference_margin) <= fastest:
        return reference
    return index


class Replanner:
    """Rank 0's measurements for one engine, and the re-plan they call for (other ranks measure nothing).

    Besides drift, **trials**: the plan chosen by prediction, the runner-up
    of the same search (the best of the policies that update the other way:
    :func:`~commsched.schedule.updating_like`) and ``auto``'s near-ties
    (:data:`~commsched.runtime.switching.TIE_MARGIN`) and the reference (PyTorch
    DDP's schedule at its defaults, kept unless another measured faster by
    :data:`REFERENCE_MARGIN`) are each measured for
    :data:`TRIAL_ITERATIONS` iterations and the fastest (by its mean) is kept. Where even the
    fastest is slower than the last warm-up iteration (the provisional plan) by
    more than :data:`TRIAL_MARGIN`, one iteration is not taken as the verdict:
    the warm-up's plan is measured as one more trial, the same way, and the
    fastest of them all is kept. The policies not kept are left out of later
    re-plans. What the simulator cannot see (e.g. the runtime's own work per
    message, the interpreter lock a launching thread waits for) cannot keep a
    bad choice when the search ranked a better one close behind.
    """

    __slots__ = (
        "_excluded_s",
        "_iter_start",
        "_last_start",
        "_waited_s",
        "again",
        "again_of",
        "fell_back",
        "monitor",
        "periods",
        "policy",
        "reference",
        "trials",
        "tried",
        "world",
    )

    def __init__(self, policy: DriftPolicy, world: int, measures: bool) -> None:
        self.policy = policy
        self.world = world
        self.monitor = DriftMonitor(policy) if measures else None
        self._iter_start: float | None = None
        self._waited_s = 0.0
        self._last_start: tuple[int, float] | None = None
        self._excluded_s = 0.0
        #: iteration -> its wall time, start to next start (planning time left out)
        self.periods: dict[int, float] = {}
        #: policies whose plans were measured and not kept (left out of re-plans)
        self.tried: set[str] = set()
        #: the plans measured in trials, in order: (plan JSON, policy, mean seconds per iteration or None)
        self.trials: list[tuple[str, str, float | None]] = []
        #: the index in :attr:`trials` of the reference's (kept unless another beats it by
        #: :data:`REFERENCE_MARGIN`), None without one
        self.reference: int | None = None
        #: the index of the trial being measured again (:meth:`after_trials`), until its reading comes
        self.again_of: int | None = None
        #: the trial measured again and its second reading (None: unmeasured); None where none was
        self.again: tuple[int, float | None] | None = None
        #: the warm-up's plan was sent to be measured as the last resort (:meth:`after_trials`): the trials end
        #: with it. Not the same as the warm-up's plan having been measured: the search may rank it a candidate
        self.fell_back = False

    def iteration_starts(self, iteration: int) -> None:
        if self._iter_start is None:
            now = time.perf_counter()
            if self._last_start is not None and self._last_start[0] == iteration - 1:
                self.periods[iteration - 1] = now - self._last_start[1] - self._excluded_s
            self._last_start, self._excluded_s = (iteration, now), 0.0
            self._iter_start, self._waited_s = now, 0.0

    def exclude(self, seconds: float) -> None:
        """Time spent planning, left out of the iteration it fell in."""
        self._excluded_s += seconds

    def trial_mean(self, first: int, now: float) -> float | None:
        """Mean wall time per iteration from iteration ``first`` to ``now``, within the current iteration
        (None where ``first`` was not measured).

        The mean, not the median: training time is the sum of the iterations, and a plan whose
        iterations alternate between fast and slow (DeAR's, whose all-gathers land in the next
        forward) has a median below its mean: in the two unshaped runs of ten repeats
        (benchmarks/results/auto-unshaped-10*), the median of three iterations kept DeAR (lookahead
        14-15) in four repeats where it then ran 1.07-1.26x the runtime's ``ddp`` of the same
        repeat. The caller takes ``now`` at the end of the last step, before any flush
        (:func:`~commsched.runtime.switching.trial_mean_then_flush` says why).
        """
        if self._last_start is None or (first not in self.periods and first != self._last_start[0]):
            return None
        current, started = self._last_start
        done = [self.periods[k] for k in range(first, current) if k in self.periods]
        return (sum(done) + now - started - self._excluded_s) / (len(done) + 1)

    def after_trials(self, baseline_iteration: int, warmup_plan: str, again: bool = False) -> tuple[str, bool]:
        """After the last trial: ``(warmup_plan, True)`` to measure the warm-up's plan as one more trial,
        where one warm-up iteration says it beats every trial by more than :data:`TRIAL_MARGIN` and it
        was not measured yet; with ``again``, ``(its plan JSON, True)`` to measure the fastest trial a second
        time, where it is not the reference and none was measured again yet (:meth:`measured_again` takes that
        reading, which then stands for the trial); else ``(plan JSON to keep, False)``, the fastest trial
        (:func:`choose`).

        Why measure the fastest again: it is the fastest of several noisy readings, so its reading is low by
        luck as well as by speed (the winner's curse), and a second reading that did not pick it is not. In
        ten repeats of ``gpt5m`` at 300 Mbit/s, the plans kept on one reading read 713 ms (median) and then
        ran 736, 1.033x; best DDP of the same run took 725 (BENCHMARKS.md, "A transformer with today's
        auto"). Where the fastest is the plan that then runs, the second trial costs nothing.

        The policies not kept join :attr:`tried` (not the kept one where a trial measured it with other knobs).
        """
        base = None if self.measured(warmup_plan) else self.periods.get(baseline_iteration)
        readings = self.readings()
        index = choose(readings, base, TRIAL_MARGIN, self.reference)
        shown = ", ".join(f"{policy} {_ms(t)}" for _, policy, t in self.trials)
        if self.again is not None:
            shown += f"; {self.trials[self.again[0]][1]} again {_ms(self.again[1])}"
        if index is None:
            log.info("commsched: trials %s; the last warm-up iteration %s: measuring the warm-up's plan too",
                     shown, _ms(base))  # fmt: skip
            self.fell_back = True
            return warmup_plan, True
        first = self.again is None and self.again_of is None
        if again and first and index != self.reference and sum(t is not None for t in readings) > 1:
            self.again_of = index
            log.info("commsched: trials %s: measuring %s again before keeping it", shown, self.trials[index][1])
            return self.trials[index][0], True
        kept = self.trials[index]
        self.tried.update(policy for _, policy, _ in self.trials if policy != kept[1])
        why = f" (the reference: no trial beat it by {REFERENCE_MARGIN:.0%})" if index == self.reference else ""
        log.info("commsched: trials %s: %s kept%s", shown, kept[1], why)
        return kept[0], False

    def measured_again(self, seconds: float | None) -> None:
        """The second reading of the trial :meth:`after_trials` asked to measure again (None: unmeasured, the
        first reading stands)."""
        assert self.again_of is not None
        self.again, self.again_of = (self.again_of, seconds), None

    def readings(self) -> list[float | None]:
        """Each trial's mean seconds per iteration, the second reading in place of the first where one was taken."""
        out = [t for _, _, t in self.trials]
        if self.again is not None and self.again[1] is not None:
            out[self.again[0]] = self.again[1]
        return out

    def measured(self, plan: str) -> bool:
        """Whether a trial measured ``plan`` (plan JSON)."""
        return any(plan == trial for trial, _, _ in self.trials)

    def waited(self, seconds: float) -> None:
        self._waited_s += seconds

    def backward_ends(self) -> None:
        """The iteration's compute: from its first forward to the end of backward, less the waits."""
        if self.monitor is not None and self._iter_start is not None:
            self.monitor.record_iteration(time.perf_counter() - self._iter_start - self._waited_s)
        self._iter_start = None

    def transfer_done(self, kind: str, nbytes: int, seconds: float) -> None:
        """A finished transfer (watcher thread): its bytes on the wire per rank."""
        if self.monitor is not None and kind in ("all_reduce", "reduce_scatter", "all_gather", "push", "pull"):
            self.monitor.record_transfer(sent_volume(kind, self.world) * nbytes, seconds)

    def due(self, iteration: int) -> bool:
        return iteration % self.policy.every == 0

    def new_plan(
        self, plan: CommPlan, planner: Callable[[Workload, NetworkEstimate, frozenset[str]], CommPlan]
    ) -> CommPlan | None:
        """The plan made again from ``plan``'s inputs scaled by the drift, or None (rank 0 decides)."""
        factors = self.monitor.drifted() if self.monitor is not None else None
        if factors is None:
            return None
        compute, bandwidth = factors
        workload = plan.workload.scaled(1.0 / compute)
        network = replace(plan.network, bandwidth_bytes_per_s=plan.network.bandwidth_bytes_per_s * bandwidth)
        log.info("commsched: compute x%.2f, bandwidth x%.2f since the plan was made: re-planned", compute, bandwidth)
        return planner(workload, network, frozenset(self.tried))


def _ms(seconds: float | None) -> str:
    return "unmeasured" if seconds is None else f"{1e3 * seconds:.1f} ms"
