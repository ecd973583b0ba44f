"""benchmarks/hetero_breakdown.py: the plan's compute alone per repeat, from a saved run's per-iteration phases."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "benchmarks" / "results" / "hetero-resnet5m" / "session7"


@pytest.fixture(scope="module")
def script(script_loader: Callable[[str], ModuleType]) -> ModuleType:
    return script_loader("benchmarks/hetero_breakdown.py")


def _run(rank: int, repeat: int, forward_ms: list[float], backward_ms: list[float]) -> dict:
    return {
        "name": "plan_compute",
        "repeat": repeat,
        "times_s": [(f + b + 10) / 1e3 for f, b in zip(forward_ms, backward_ms, strict=True)],
        "phases_s": {"forward": [f / 1e3 for f in forward_ms], "backward": [b / 1e3 for b in backward_ms]},
    }


def test_the_slowest_rank_of_each_iteration_is_what_a_lock_step_run_waits_for(script: ModuleType) -> None:
    # two ranks, each slowest in alternate iterations: each median is 100 ms, the slowest per iteration 120
    report = {
        "runs": [
            {"rank": 0, "runs": [_run(0, 0, [999, 20, 20, 20, 20], [999, 100, 60, 100, 60])]},
            {"rank": 1, "runs": [_run(1, 0, [999, 20, 20, 20, 20], [999, 60, 100, 60, 100])]},
        ]
    }
    (row,) = script.compute_alone(report, skip=1)
    assert row.repeat == 0
    assert row.medians_ms == pytest.approx([100.0, 100.0])
    assert row.slowest_median_ms == pytest.approx(100.0)
    assert row.slowest_each_ms == pytest.approx(120.0)
    assert row.cv == pytest.approx([0.2, 0.2])  # 80 and 120 around 100
    assert row.iteration_ms == pytest.approx(110.0)


def _breakdown(saved: Path) -> str:
    script = ROOT / "benchmarks" / "hetero_breakdown.py"
    return subprocess.run([sys.executable, str(script), str(saved)], capture_output=True, text=True, check=True).stdout


def test_a_saved_run_without_traces_still_gets_its_compute_alone() -> None:
    out = _breakdown(SESSION)
    assert "no trace-plan.json" in out
    assert "plan's compute alone: measured 1549 ms, predicted 1300 ms (-16.1 %)" in out
    assert out.count("  repeat ") == 3, out


def test_a_run_that_timed_references_shows_the_prediction_at_its_speed_and_each_repeats_factors() -> None:
    out = _breakdown(SESSION.parent / "session25")
    assert "  at the runs' speed: predicted 490 ms (+1.5 %)" in out
    assert "  repeat 0: speed factor per rank 1.076 1.055 0.985 (reference before the repeat over calibration)" in out
    assert out.count("speed factor per rank") == 3


def test_the_overlap_paid_is_the_traced_backward_over_the_compute_alone_of_the_traced_repeat(
    script: ModuleType,
) -> None:
    from commsched.trace import Trace, TraceEvent

    mib = 2**20
    trace = Trace()
    for it in (0, 1, 2):
        t = 10.0 * it
        trace.add(TraceEvent("layer1", "backward", 0, t + 1.0, t + 2.0, iteration=it))
        trace.add(TraceEvent("layer0", "backward", 0, t + 2.0, t + 2.5, iteration=it))  # 1.5 s in all
        trace.add(TraceEvent("b0", "all_reduce", 0, t + 1.5, t + 2.0, bytes=4 * mib, iteration=it))  # inside
        trace.add(TraceEvent("b1", "all_reduce", 0, t + 2.0, t + 4.0, bytes=8 * mib, iteration=it))  # a quarter
        trace.add(TraceEvent("b2", "all_reduce", 0, t + 2.5, t + 3.0, bytes=8 * mib, iteration=it))  # after it

    def run(repeat: int, backward_s: float) -> dict:
        return {"name": "plan_compute", "repeat": repeat, "phases_s": {"backward": [9.0, backward_s, backward_s]}}

    report = {"runs": [{"rank": 0, "runs": [run(0, 1.2), run(1, 0.5)]}]}  # repeat 1 is not traced
    (extra, tasks, moved) = script.overlap_paid(report, trace, skip=1)[0]
    assert (extra, tasks, moved) == (pytest.approx(300.0), 2, pytest.approx(6.0))
