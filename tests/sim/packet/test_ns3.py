"""The packet model against ns-3 on a tiny scenario (skipped without ns-3's Python bindings)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ns3_validate.py"
_spec = importlib.util.spec_from_file_location("ns3_validate", _SCRIPT)
assert _spec is not None and _spec.loader is not None
ns3_validate = importlib.util.module_from_spec(_spec)
sys.modules["ns3_validate"] = ns3_validate  # dataclasses look their module up there
_spec.loader.exec_module(ns3_validate)

_why = ns3_validate.ns3_available()


@pytest.mark.skipif(_why is not None, reason=_why or "")
def test_a_4_to_1_incast_matches_ns3_within_10_percent_median_fct() -> None:
    [scenario] = ns3_validate.scenarios(quick=True)
    for transport in ("tcp", "dctcp"):
        ref = ns3_validate.ns3(scenario, transport)
        got = ns3_validate.ours(scenario, transport)
        assert statistics.median(got) == pytest.approx(statistics.median(ref), rel=0.10)


def test_the_same_scenario_runs_on_our_side_without_ns3() -> None:
    [scenario] = ns3_validate.scenarios(quick=True)
    fcts = ns3_validate.ours(scenario, "tcp")
    assert len(fcts) == 4 and all(f > 0 for f in fcts)


@pytest.mark.skipif(_why is not None, reason=_why or "")
def test_ns3s_stale_duplicate_ack_counts_explain_its_slow_7_to_1_incast_flow() -> None:
    # stock ns-3 keeps counting old duplicate ACKs as delivered segments and sends up to 48 segments beyond
    # its window, which makes its slowest flow 4.16 ms against our 3.01 ms; with the counts reset as Linux
    # resets them, the two agree (2.97 ms: 1.1 %)
    [scenario] = [s for s in ns3_validate.scenarios() if s.name == "incast 7->1, one switch"]
    got = max(ns3_validate.ours(scenario, "tcp"))
    stock = ns3_validate.ns3_run(scenario, "tcp")
    assert stock.overshoot_segments > 10 and max(stock.fcts) > 1.2 * got
    linux = ns3_validate.ns3_run(scenario, "tcp", linux_reno_sack=True)
    assert linux.overshoot_segments == 0 and max(linux.fcts) == pytest.approx(got, rel=0.05)
