"""``commsched.trace.compare``: task-by-task comparison of a predicted and a measured trace."""

from __future__ import annotations

import pytest

from commsched import zoo
from commsched.profile import measured_cluster
from commsched.sim import simulate
from commsched.trace import Trace, TraceEvent
from commsched.trace.compare import compare_traces, summarize, trace_iteration_ms


def _trace(durations_ms: dict[tuple[str, str], list[float]], workers: int = 1, period_s: float = 1.0) -> Trace:
    """Iteration k of every task starts at k·period_s and lasts its k-th duration."""
    trace = Trace()
    for (kind, task), values in durations_ms.items():
        for k, ms in enumerate(values):
            for w in range(workers):
                trace.add(TraceEvent(task, kind, w, k * period_s, k * period_s + ms / 1e3, 0, k))
    return trace


def test_compare_traces_matches_kind_and_task_and_takes_medians_over_iterations() -> None:
    predicted = _trace(
        {
            ("forward", "fc"): [2.0, 2.0, 2.0],
            ("all_reduce", "bucket0"): [10.0, 10.0, 10.0],
            ("all_reduce", "bucket1"): [4.0, 4.0, 4.0],
        }
    )
    measured = _trace(
        {
            ("forward", "fc"): [2.0, 2.1, 1.9],
            ("all_reduce", "bucket0"): [12.0, 99.0, 12.5, 13.0],  # median 12.75
            ("backward", "fc"): [3.0, 3.0, 3.0],
        },
        workers=2,
    )
    rows = {(r.kind, r.task): r for r in compare_traces(predicted, measured)}
    assert set(rows) == {("forward", "fc"), ("all_reduce", "bucket0"), ("all_reduce", "bucket1"), ("backward", "fc")}
    fc = rows[("forward", "fc")]
    assert fc.predicted_ms == pytest.approx(2.0) and fc.measured_ms == pytest.approx(2.0)
    assert fc.error_pct == pytest.approx(0.0, abs=1e-9)
    b0 = rows[("all_reduce", "bucket0")]
    assert b0.measured_ms == pytest.approx(12.75) and b0.measured_count == 8
    assert b0.error_pct == pytest.approx((10.0 - 12.75) / 12.75 * 100)
    assert rows[("all_reduce", "bucket1")].measured_ms is None and rows[("all_reduce", "bucket1")].error_pct is None
    assert rows[("backward", "fc")].predicted_ms is None

    summary = summarize(list(rows.values()))
    assert (summary.matched, summary.only_predicted, summary.only_measured) == (2, 1, 1)
    assert summary.median_abs_error_pct == pytest.approx((0 + 2.75 / 12.75 * 100) / 2)
    assert summary.weighted_error_pct == pytest.approx(2.75 / (2.0 + 12.75) * 100)


def test_skipping_warmup_iterations_and_filtering_kinds() -> None:
    predicted = _trace({("all_reduce", "b"): [50.0, 10.0, 10.0]})
    measured = _trace({("all_reduce", "b"): [500.0, 900.0, 8.0, 8.0], ("forward", "x"): [1.0]})
    rows = compare_traces(predicted, measured, skip_predicted=1, skip_measured=2, kinds=["all_reduce"])
    assert [(r.kind, r.task) for r in rows] == [("all_reduce", "b")]
    assert rows[0].predicted_ms == pytest.approx(10.0) and rows[0].measured_ms == pytest.approx(8.0)
    assert rows[0].error_pct == pytest.approx(25.0)


def test_trace_iteration_time_from_meta_or_from_events() -> None:
    trace = _trace({("forward", "a"): [1.0, 1.0, 1.0, 1.0]}, period_s=0.25)
    assert trace_iteration_ms(trace) == pytest.approx(250.0)
    trace.meta["iteration_starts_s"] = [0.0, 0.1, 0.3, 0.6]
    assert trace_iteration_ms(trace) == pytest.approx(200.0)
    assert trace_iteration_ms(trace, skip=2) == pytest.approx(300.0)
    assert trace_iteration_ms(Trace()) is None


def test_a_simulated_trace_compared_with_itself_has_no_error() -> None:
    result = simulate(zoo.load("resnet18"), measured_cluster(100e-6, 1e-9, 4), "ddp", iterations=3, warmup=1)
    assert result.trace is not None
    rows = compare_traces(result.trace, result.trace)
    assert rows and all(r.error_pct == pytest.approx(0.0, abs=1e-9) for r in rows if r.error_pct is not None)
    assert trace_iteration_ms(result.trace, skip=1) == pytest.approx(result.iteration_ms)
