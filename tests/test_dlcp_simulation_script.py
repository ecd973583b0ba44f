"""benchmarks/dlcp_simulation.py runs each part for every transport, at a tiny scale."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def script(script_loader: Callable[[str], ModuleType]) -> ModuleType:
    return script_loader("benchmarks/dlcp_simulation.py")


def _args(**over: object) -> argparse.Namespace:
    base = dict(hosts=3, hosts_per_leaf=16, gbps=10.0, servers=3, model="mobilenet_v2", load=0.3, duration_s=0.001,
                loss_bound=0.1, k_bytes=90_000, iterations=1, allowance=False, progress_s=30.0)  # fmt: skip
    return argparse.Namespace(**(base | over))


@pytest.mark.parametrize("name", ["dctcp", "pfabric", "dlcp"])
def test_the_fct_part_times_every_training_flow_and_dlcp_gives_up_at_most_its_bound(
    script: ModuleType, name: str
) -> None:
    args = _args()
    row = script.fct_run(name, script.configs(args)[name], args)
    assert row["training"]["flows"] == 3 * 2 * 2  # a push and a pull between every worker and every other server
    assert row["training"]["avg_ms"] > 0 and row["training"]["p99_ms"] >= row["training"]["avg_ms"]
    if name == "dlcp":  # the count rule: every flow STOPs once 90 % arrived
        assert row["dlcp"]["at_bound"] == 12 and 0 < row["dlcp"]["lost_fraction"] <= 0.1
    else:
        assert row["dlcp"] is None


def test_the_iteration_part_times_the_measured_iterations_messages(script: ModuleType) -> None:
    args = _args(load=0.0)
    row = script.iteration_run("dlcp", script.configs(args)["dlcp"], args, 0.0)
    assert row["iteration_ms"] > row["compute_ms"] > 0
    assert row["training_messages"]["flows"] > 0 and row["dlcp"]["messages"] > 0
    assert row["dlcp"]["max_lost_fraction"] <= 0.1


def test_progress_reports_the_watched_fabric_while_the_block_runs_and_stops_after(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    fabric = SimpleNamespace(now=0.0125, processed=2_000_000)
    with script.Progress("iter x", 0.5, every_s=0.01) as progress:
        progress.watch(SimpleNamespace(fabric=fabric))
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("  iter x: 12.5 of at most 500 simulated ms, 2.0 M events") for line in lines)
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # the reporter ended with the block
