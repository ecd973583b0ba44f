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
    args += ["--sim", "max_concurrent=2", "--measured", str(path), "--skip-measured", "3"]
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


def test_a_trace_with_no_task_of_the_prediction_is_refused_with_the_names_of_both_sides(tmp_path: Path) -> None:
    result = simulate(zoo.load("resnet18"), load_cluster("8xV100-10GbE"), "ddp", 6, 3)
    assert result.trace is not None
    events = [replace(e, task=f"other{e.task}") for e in result.trace.events]
    path = tmp_path / "other.json"
    Trace(events, {}).save(path)
    args = ["compare", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "--measured", str(path)]
    out = CliRunner().invoke(cli, args, terminal_width=200)
    assert out.exit_code == 1, out.output
    assert "no task of the measured trace matches a predicted one" in out.output
    assert "predicted: forward conv1," in out.output and "forward otherconv1," in out.output


def test_compare_trace_refuses_traces_with_no_task_in_common(tmp_path: Path) -> None:
    result = simulate(zoo.load("resnet18"), load_cluster("8xV100-10GbE"), "ddp", 3, 1)
    assert result.trace is not None
    predicted, measured = tmp_path / "p.json", tmp_path / "m.json"
    result.trace.save(predicted)
    Trace([replace(e, kind="push") for e in result.trace.events], {}).save(measured)
    out = CliRunner().invoke(cli, ["profile", "compare-trace", "-p", str(predicted), "-m", str(measured)])
    assert out.exit_code == 1 and "no task of the measured trace" in out.output, out.output
