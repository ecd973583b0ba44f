"""``commsched advise`` and ``commsched plan`` end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from commsched.cli import cli
from commsched.schedule import LOSSLESS, CommPlan


def _json(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_advise_json_ranks_every_lossless_policy_and_plots_the_winner(tmp_path: Path) -> None:
    png, plan_file = tmp_path / "winner.png", tmp_path / "winner.json"
    data = _json(
        "advise", "-m", "resnet18", "-c", "8xV100-10GbE", "--trials", "2", "--json", "--plot", str(png),
        "--save-plan", str(plan_file),
    )  # fmt: skip
    assert {c["policy"] for c in data["candidates"]} == set(LOSSLESS)
    times = [c["iteration_ms"] for c in data["candidates"]]
    assert times == sorted(times) and data["winner"] == data["candidates"][0]["policy"]
    assert data["parallelize"].startswith("model, optimizer = commsched.parallelize(model, optimizer, policy=")
    assert data["ideal_iteration_ms"] <= times[0]
    assert png.stat().st_size > 0
    assert CommPlan.load(plan_file).policy == data["winner"]


def test_advise_table_prints_the_parallelize_call_and_the_search_time() -> None:
    result = CliRunner().invoke(
        cli, ["advise", "-m", "resnet18", "-c", "8xV100-10GbE", "--trials", "2"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "commsched.parallelize(model, optimizer, policy=" in result.stdout
    assert "ideal" in result.stdout and "simulations in" in result.stdout


def test_plan_json_and_out_file_load_as_a_comm_plan_carrying_the_per_rank_batches(tmp_path: Path) -> None:
    out = tmp_path / "plans" / "plan.json"
    data = _json("plan", "-m", "resnet18", "-c", "hetero-8", "--budget-s", "2", "--json", "-o", str(out))
    assert sum(data["batch_sizes"]) == data["global_batch"] == 64 * 8
    assert {b["name"] for b in data["baselines"]} == {"even_allreduce", "proportional_allreduce"}
    assert data["speedup_over_even_allreduce"] >= 1.0
    plan = CommPlan.load(out)
    assert plan.policy == data["policy"] and len(plan.tasks) == len(data["buckets"])
    assert list(plan.batch_sizes or ()) == data["batch_sizes"] and plan.global_batch == data["global_batch"]
    assert [r["local_batch"] for r in data["ranks"]] == data["batch_sizes"]
    assert sum(r["gradient_weight"] for r in data["ranks"]) == pytest.approx(1.0)
    assert data["written"] == {"plan": str(out)}
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]


def test_plan_reports_a_device_that_cannot_hold_one_sample() -> None:
    args = ["plan", "-m", "resnet18", "-c", "hetero-8", "--activation-mb-per-sample", "12000", "--budget-s", "1"]
    result = CliRunner().invoke(cli, [*args, "--no-stages"])
    assert result.exit_code == 1
    assert "does not fit on rank 2 (GTX-1080Ti" in result.output and "short by" in result.output


def test_plan_places_stages_where_data_parallelism_is_refused(tmp_path: Path) -> None:
    args = ["plan", "-m", "resnet18", "-c", "hetero-8", "--activation-mb-per-sample", "12000", "--budget-s", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "data parallelism refused: plan: resnet18 does not fit on rank 2 (GTX-1080Ti" in result.output
    assert "pipelines · schedule 1f1b" in result.output and "analytical estimate" in result.output
    data = _json(*args, "--json", "-o", str(tmp_path / "staged.json"))
    plan = CommPlan.load(tmp_path / "staged.json")
    assert plan.stages is not None and plan.stages.to_dict() == data["stages"]
    assert data["global_batch"] == plan.global_batch and "short by" in data["data_parallel_refused"]


def test_plan_table_shows_plan_and_baselines_with_time_and_throughput_and_the_search_time() -> None:
    args = ["plan", "-m", "resnet18", "-c", "hetero-8", "--budget-s", "2", "--policies", "ddp,horovod"]
    result = CliRunner().invoke(cli, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for row in ("chosen", "even_allreduce", "proportional_allreduce"):
        line = next(line for line in lines if row in line)
        assert re.search(r"\d+\.\d\d .* [\d,]+ .* \d\.\d\dx", line), line  # iteration ms, samples/s, speed-up
    assert "64×8" in result.stdout  # even DP's per-rank batches, run-length
    assert re.search(r"simulations in \d+\.\d\d s \(budget 2 s", result.stdout)
    assert "baseline even_ps not simulated: hetero-8 lists no parameter servers" in result.stdout
    assert next(line for line in lines if "chosen" in line).split("│")[2].strip() in ("ddp", "horovod")
    bad = CliRunner().invoke(cli, ["plan", "-m", "resnet18", "-c", "hetero-8", "--policies", "ddp,topk"])
    assert bad.exit_code == 2 and "not lossless policies: topk" in bad.output
