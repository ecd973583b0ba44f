"""Predicted against measured: the simulator's trace beside the runtime's, task by task.

>>> rows = compare_traces(Trace.load("predicted.json"), Trace.load("measured.json"))
>>> summarize(rows).median_abs_error_pct

and, for the iteration time of several policies on a measured setup::

    workload = profile_model(...)                      # compute, measured
    cluster = probe_local(world_size=4).cluster()      # network, measured
    predict(workload, cluster, ["ddp", "dear"])        # {"ddp": 812.4, "dear": 640.1} ms

Tasks are matched on ``(kind, task)``: the simulator and the runtime name the
tasks of one plan alike (``bucket0``, ``rs3``, a layer name for its forward).
A task's time is the median of its durations over iterations and workers
(iterations before ``skip_*`` left out). ``error_pct = (predicted − measured)
/ measured × 100``: positive when the simulator is pessimistic.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from commsched.cluster import Cluster
from commsched.schedule import build_plan
from commsched.sim import CommModel, SimOptions, simulate
from commsched.trace import Trace
from commsched.workload import Workload

__all__ = [
    "ComparisonSummary",
    "TaskComparison",
    "compare_traces",
    "gloo_options",
    "predict",
    "summarize",
    "trace_iteration_ms",
]


@dataclass(frozen=True)
class TaskComparison:
    """One task in both traces (or in one of them: the other side is None)."""

    kind: str
    task: str
    predicted_ms: float | None
    measured_ms: float | None
    predicted_count: int
    measured_count: int

    @property
    def error_pct(self) -> float | None:
        """``(predicted − measured) / measured × 100``; None when a side is missing or measured is 0."""
        if self.predicted_ms is None or self.measured_ms is None or self.measured_ms <= 0:
            return None
        return (self.predicted_ms - self.measured_ms) / self.measured_ms * 100.0


def _durations(trace: Trace, skip: int) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], float]]:
    """Per (kind, task): durations in ms (iterations from the first + ``skip`` on), and the first start."""
    first_iteration = min((e.iteration for e in trace.events), default=0)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    first_start: dict[tuple[str, str], float] = {}
    for e in trace.events:
        if e.iteration < first_iteration + skip:
            continue
        key = (e.kind, e.task)
        groups[key].append(e.duration_s * 1e3)
        first_start[key] = min(first_start.get(key, math.inf), e.start_s)
    return groups, first_start


def compare_traces(
    predicted: Trace,
    measured: Trace,
    *,
    skip_predicted: int = 0,
    skip_measured: int = 0,
    kinds: Iterable[str] | None = None,
) -> list[TaskComparison]:
    """Task-by-task comparison of two traces (see the module docstring).

    ``skip_predicted`` / ``skip_measured``: leading iterations of each trace to
    leave out (warm-up; the runtime's first iterations run a provisional plan).
    ``kinds``: only these event kinds (default all). Rows follow the predicted
    trace's order of first start, then tasks found only in the measured trace.
    """
    wanted = None if kinds is None else set(kinds)
    pred, pred_start = _durations(predicted, skip_predicted)
    meas, meas_start = _durations(measured, skip_measured)
    keys = sorted(pred, key=lambda k: (pred_start[k], k))
    keys += sorted((k for k in meas if k not in pred), key=lambda k: (meas_start[k], k))
    rows = []
    for key in keys:
        if wanted is not None and key[0] not in wanted:
            continue
        p, m = pred.get(key, []), meas.get(key, [])
        rows.append(
            TaskComparison(
                kind=key[0],
                task=key[1],
                predicted_ms=statistics.median(p) if p else None,
                measured_ms=statistics.median(m) if m else None,
                predicted_count=len(p),
                measured_count=len(m),
            )
        )
    return rows


@dataclass(frozen=True)
class ComparisonSummary:
    """Errors over the tasks found in both traces.

    ``weighted_error_pct``: Σ|predicted − measured| / Σ measured × 100, so long
    tasks count by their length.
    """

    matched: int
    only_predicted: int
    only_measured: int
    mean_abs_error_pct: float | None
    median_abs_error_pct: float | None
    weighted_error_pct: float | None
    predicted_total_ms: float
    measured_total_ms: float


def summarize(rows: Sequence[TaskComparison]) -> ComparisonSummary:
    both = [r for r in rows if r.predicted_ms is not None and r.measured_ms is not None]
    errors = [abs(e) for r in both if (e := r.error_pct) is not None]
    pred_total = sum(r.predicted_ms for r in both if r.predicted_ms is not None)
    meas_total = sum(r.measured_ms for r in both if r.measured_ms is not None)
    deviation = sum(abs(r.predicted_ms - r.measured_ms) for r in both if r.predicted_ms is not None and r.measured_ms)
    return ComparisonSummary(
        matched=len(both),
        only_predicted=sum(1 for r in rows if r.measured_ms is None),
        only_measured=sum(1 for r in rows if r.predicted_ms is None),
        mean_abs_error_pct=statistics.fmean(errors) if errors else None,
        median_abs_error_pct=statistics.median(errors) if errors else None,
        weighted_error_pct=deviation / meas_total * 100.0 if meas_total > 0 else None,
        predicted_total_ms=pred_total,
        measured_total_ms=meas_total,
    )


def trace_iteration_ms(trace: Trace, skip: int = 0) -> float | None:
    """Median iteration time of a trace, in ms; None with fewer than two iterations.

    From ``meta["iteration_starts_s"]`` when the trace has it (the simulator's:
    forward start to forward start), else from the first event of each
    iteration on the lowest worker (for a runtime trace of collectives only,
    the first collective's start: an approximation).
    """
    starts = trace.meta.get("iteration_starts_s")
    if not (isinstance(starts, list) and len(starts) >= 2):
        if not trace.events:
            return None
        worker = min(e.worker for e in trace.events)
        bounds = trace.iteration_bounds(worker)
        starts = [lo for lo, _ in bounds.values()]
    periods = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)][skip:]
    return statistics.median(periods) if periods else None


# ---------------------------------------------------------------- predictions


def gloo_options(workload: Workload, cluster: Cluster, policy: str, **knobs: Any) -> SimOptions:
    """Simulator options that match ``commsched.runtime`` on gloo (CPU tensors).

    * ``algorithm="ring"``: gloo's all-reduce is a ring (``gloo::allreduce``
      with no algorithm set runs its ring), and the runtime's reduce-scatter
      and all-gather are rings of point-to-point steps.
    * ``max_concurrent``: the runtime's agent issues collectives without
      waiting for earlier ones. Its all-reduces go to gloo, whose process group
      serves them on 2 worker threads (``ProcessGroupGloo::Options::threads``
      defaults to 2), so 2 can be in flight; its reduce-scatters and
      all-gathers go to one ring thread (``Collectives``), one at a time. So 2
      when the policy's plan is all all-reduces, else 1.
    * ``update_ms=0``: a profile from :func:`commsched.profile.profile_model`
      has no optimizer step in it; pass ``update_ms`` to :func:`predict` to
      add one.
    """
    plan = build_plan(policy, workload, CommModel.from_cluster(cluster).estimate(), **knobs)
    all_reduce_only = all(task.kind == "all_reduce" for task in plan.tasks)
    return SimOptions(algorithm="ring", max_concurrent=2 if all_reduce_only else 1)


def predict(
    workload: Workload,
    cluster: Cluster,
    policies: Iterable[str],
    iterations: int = 20,
    *,
    warmup: int = 3,
    options: SimOptions | Mapping[str, Any] | None = None,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    update_ms: float = 0.0,
) -> dict[str, float]:
    """Predicted iteration time in ms of each policy, by :func:`commsched.sim.simulate`.

    ``options``: simulator options for every policy; default
    :func:`gloo_options` per policy (the runtime on gloo) with ``update_ms``.
    ``knobs``: per policy, its knobs. Raises what ``simulate`` raises.
    """
    out: dict[str, float] = {}
    for policy in policies:
        policy_knobs = dict((knobs or {}).get(policy, {}))
        if options is None:
            base = gloo_options(workload, cluster, policy, **policy_knobs)
            opts: SimOptions | Mapping[str, Any] = SimOptions(base.algorithm, base.max_concurrent, update_ms)
        else:
            opts = options
        result = simulate(workload, cluster, policy, iterations, warmup, options=opts, trace=False, **policy_knobs)
        out[policy] = result.iteration_ms
    return out
