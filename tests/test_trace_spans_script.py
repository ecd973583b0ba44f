"""benchmarks/trace_spans.py: the spans of a trace whose intervals are known, gzipped or not."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from commsched.trace import Trace, TraceEvent


def _trace(hook_ms: float) -> Trace:
    """Two ranks, four iterations of 100 ms: forward 0-30 ms, backward of two layers (the second ending at
    70 ms plus ``hook_ms`` on rank 0 only), an all-reduce to 80 ms plus the hook, the next forward at 90."""
    trace = Trace(meta={"policy": "wfbp", "source": "measured"})
    for rank in (0, 1):
        extra = hook_ms if rank == 0 else 0.0
        for i in range(4):
            t = 0.1 * i + 0.5 * rank  # each rank counts from its own start
            trace.add(TraceEvent("a", "forward", rank, t, t + 0.010, 0, i))
            trace.add(TraceEvent("b", "forward", rank, t + 0.010, t + 0.030, 0, i))
            trace.add(TraceEvent("b", "backward", rank, t + 0.030, t + 0.050, 0, i))
            trace.add(TraceEvent("a", "backward", rank, t + 0.050, t + 0.070 + extra / 1e3, 0, i))
            trace.add(TraceEvent("a.weight", "all_reduce", rank, t + 0.055, t + 0.080 + extra / 1e3, 4096, i))
    return trace


def test_each_rank_s_spans_are_the_medians_of_its_iterations(
    script_loader: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    spans = script_loader("benchmarks/trace_spans.py")
    plain, zipped = tmp_path / "trace-none-wfbp.json", tmp_path / "trace-none-wfbp.json.gz"
    _trace(5.0).save_chrome(plain)
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, zipped):
        got = spans.spans(Trace.load(path), skip=1)
        assert sorted(got) == [0, 1]
        assert got[1] == pytest.approx({"fwd+bwd": 70.0, "forward": 30.0, "backward": 40.0, "tail": 10.0,
                                        "to next": 20.0})  # fmt: skip
        # rank 0's hook work falls inside its backward: the backward and fwd+bwd grow, the rest stays
        assert got[0] == pytest.approx({"fwd+bwd": 75.0, "forward": 30.0, "backward": 45.0, "tail": 10.0,
                                        "to next": 15.0})  # fmt: skip
    table = spans.table([plain], skip=1)
    assert "| wfbp | 0 | 75.0 | 30.0 | 45.0 | 10.0 | 15.0 |" in table


def test_a_trace_without_a_backward_is_refused_naming_rank_and_iteration(
    script_loader: Callable[[str], ModuleType],
) -> None:
    spans = script_loader("benchmarks/trace_spans.py")
    for kind, iteration in (("backward", 2), ("forward", 3)):  # the last iteration has no next: checked too
        trace = _trace(0.0)
        trace.events = [e for e in trace.events if (e.kind, e.worker, e.iteration) != (kind, 1, iteration)]
        with pytest.raises(SystemExit, match=f"rank 1, iteration {iteration}"):
            spans.spans(trace, skip=0)
