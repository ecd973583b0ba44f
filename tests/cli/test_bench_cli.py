"""``commsched bench``: what its help promises is what it accepts, checked before anything starts."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from commsched.cli import cli

bench_cli = importlib.import_module("commsched.cli.bench")


class Started(Exception):
    pass


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replaces run_bench: records the config and stops there."""
    calls: list[Any] = []

    def run_bench(config: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(config)
        raise Started

    monkeypatch.setattr(bench_cli, "run_bench", run_bench)
    return calls


def test_warmup_help_states_the_minimum_the_command_enforces() -> None:
    out = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200).output
    assert "at least 3 unless only torch_ddp runs" in out


def test_a_warmup_below_3_with_commsched_policies_is_refused_as_a_bad_option(
    started: list[Any], tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, ["bench", "--warmup", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Invalid value for '--warmup'" in result.output, result.output
    assert "need >= 3, got 2" in result.output and not started


def test_a_short_warmup_is_fine_for_torch_ddp_alone(started: list[Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--warmup", "0", "--policies", "torch_ddp", "--out", str(tmp_path)])
    assert isinstance(result.exception, Started) and started[0].warmup == 0


def test_auto_with_a_warmup_shorter_than_its_trials_is_run_with_a_note_saying_so(
    started: list[Any], tmp_path: Path
) -> None:
    from commsched.bench.config import AUTO_WARMUP

    args = ["bench", "--policies", "auto,ddp", "--out", str(tmp_path)]
    short = CliRunner().invoke(cli, [*args, "--warmup", "3"], terminal_width=200)
    assert isinstance(short.exception, Started), short.output
    assert f"with --warmup 3 its timed iterations include those trials (--warmup {AUTO_WARMUP}" in short.output
    enough = CliRunner().invoke(cli, [*args, "--warmup", str(AUTO_WARMUP)], terminal_width=200)
    assert isinstance(enough.exception, Started) and "note:" not in enough.output


def test_a_bad_knob_is_refused_when_the_command_line_is_parsed(started: list[Any], tmp_path: Path) -> None:
    for knob, message in (
        ("dear.lookahead=0", "dear: knob 'lookahead' must be a whole number >= 1, got 0"),
        ("dear.colour=1", "dear: unknown knob 'colour'"),
        ("wfbp.x=1", "wfbp: unknown knob 'x'; known: none"),
        ("ddp.bucket_cap_mb=4", "ddp is not run here"),
    ):
        args = ["bench", "--policies", "torch_ddp,dear,wfbp", "--knob", knob, "--out", str(tmp_path)]
        result = CliRunner().invoke(cli, args, terminal_width=200)
        assert result.exit_code == 2 and message in result.output, (knob, result.output)
    assert started == []  # nothing ran


def test_help_says_the_ddp_grid_always_runs_and_how_to_turn_it_off() -> None:
    out = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200).output
    assert "--ddp-grid / --no-ddp-grid" in out
    assert "bucket_cap_mb 1, 4, 25 × find_unused_parameters False, True" in out
    assert "default DDP (ddp[25MiB])" in out and "best DDP" in out


def test_the_ddp_grid_is_on_unless_turned_off(started: list[Any], tmp_path: Path) -> None:
    for extra, grid in (([], True), (["--no-ddp-grid"], False)):
        result = CliRunner().invoke(cli, ["bench", "--policies", "dear", *extra, "--out", str(tmp_path)])
        assert isinstance(result.exception, Started), result.output
        assert started[-1].ddp_grid is grid and started[-1].policies == ("dear",)


@pytest.fixture
def kernel_without_netem_or_nftables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Namespaces work; the kernel lacks sch_netem and nftables' bridge family."""
    from commsched.testbed import kernel, netns

    monkeypatch.setattr(bench_cli, "netns_unavailable_reason", lambda: None)
    monkeypatch.setattr(kernel, "netns_unavailable_reason", lambda: None)
    monkeypatch.setattr(kernel.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(kernel, "has", lambda feature: feature not in ("netem", "nft"))
    assert netns.link_unavailable_reason(netns.LinkShape()) is None  # plain links need neither


@pytest.mark.usefixtures("kernel_without_netem_or_nftables")
@pytest.mark.parametrize(
    ("option", "hint", "missing"),
    [("--delay", "--delay/--jitter", "CONFIG_NET_SCH_NETEM"), ("--loss", "--loss", "CONFIG_NF_TABLES_BRIDGE")],
)
def test_a_delay_or_loss_the_kernel_cannot_make_is_refused_at_parse_time(
    started: list[Any], tmp_path: Path, option: str, hint: str, missing: str
) -> None:
    result = CliRunner().invoke(cli, ["bench", option, "1", "--out", str(tmp_path)], terminal_width=300)
    assert result.exit_code == 2 and f"Invalid value for {hint}" in result.output, result.output
    assert missing in result.output and not started


@pytest.mark.usefixtures("kernel_without_netem_or_nftables")
def test_rate_limits_alone_need_neither_and_start(started: list[Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--bandwidth", "300mbit", "--out", str(tmp_path)])
    assert isinstance(result.exception, Started), result.output


def test_the_links_mtu_reaches_the_config_and_is_refused_with_plan_or_out_of_range(
    started: list[Any], tmp_path: Path
) -> None:
    base = ["bench", "--isolation", "loopback", "--policies", "dlcp", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, [*base, "--mtu", "9000"])
    assert isinstance(result.exception, Started) and started[-1].mtu_bytes == 9000
    result = CliRunner().invoke(cli, [*base, "--mtu", "100"])
    assert result.exit_code == 2 and "--mtu" in result.output and "100" in result.output
    result = CliRunner().invoke(cli, ["bench", "--plan", "auto", "--mtu", "9000", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--mtu" in result.output and not started[1:]


def test_pinned_cores_reach_the_config_and_are_refused_beyond_the_cores_or_with_plan(
    started: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})  # a 2-core machine
    base = ["bench", "--isolation", "loopback", "--policies", "ddp", "--out", str(tmp_path), "--pin-cores"]
    result = CliRunner().invoke(cli, [*base, "--workers", "2"])
    assert isinstance(result.exception, Started) and started[-1].pin_cores
    result = CliRunner().invoke(cli, [*base, "--workers", "3"])
    assert result.exit_code == 2 and "--pin-cores" in result.output and "3 workers" in result.output, result.output
    result = CliRunner().invoke(cli, ["bench", "--plan", "auto", "--pin-cores", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--pin-cores" in result.output and len(started) == 1, result.output
