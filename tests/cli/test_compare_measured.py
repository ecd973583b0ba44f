"""`commsched compare --measured`: a trace compared with its own prediction has zero error; a slower one does not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from commsched import zoo
from commsched.cli import cli
from commsched.cluster import load_cluster
from commsched.sim import simulate
from commsched.trace import Trace


def _measured(tmp_path: Path, slowdown: float) -> Path:
    result = simulate(zoo.load("resnet18"), load_cluster("8xV100-10GbE"), "ddp", 6, 3, options={"max_concurrent": 2})
    assert result.trace is not None
    events = [replace(e, end_s=e.start_s + e.duration_s * slowdown) for e in result.trace.events]
    path = tmp_path / "measured.json"
    Trace(events, dict(result.trace.meta)).save(path)
    return path


def _run(path: Path) -> str:
    args = ["compare", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "-n", "6", "--warmup", "3"]
    args += ["-o", "max_concurrent=2", "--measured", str(path), "--skip-measured", "3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_trace_compared_with_its_own_prediction_has_zero_task_error(tmp_path: Path) -> None:
    out = _run(_measured(tmp_path, 1.0))
    assert "median |error| 0.0 %" in out


def test_a_uniformly_slower_trace_shows_the_slowdown_per_task(tmp_path: Path) -> None:
    out = _run(_measured(tmp_path, 1.5))
    assert "median |error| 33.3 %" in out  # predicted/measured - 1 = 1/1.5 - 1


def test_measured_needs_exactly_one_policy(tmp_path: Path) -> None:
    path = _measured(tmp_path, 1.0)
    result = CliRunner().invoke(cli, ["compare", "-m", "resnet18", "-c", "8xV100-10GbE", "--measured", str(path)])
    assert result.exit_code != 0 and "exactly one" in result.output
