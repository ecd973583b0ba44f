"""Predicted against measured: the simulator's trace beside the runtime's, task by task.

>>> rows = compare_traces(Trace.load("predicted.json"), Trace.load("measured.json"))
>>> summarize(rows).median_abs_error_pct

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from commsched.trace.core import Trace

__all__ = ["ComparisonSummary", "TaskComparison", "compare_traces", "summarize", "trace_iteration_ms"]


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
