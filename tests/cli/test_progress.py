"""Long commands say how far they are without a terminal: one line per finished phase on stderr."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from commsched.cli import cli
from commsched.cli.progress import PlainProgress

LINE = re.compile(r"^\[ *\d+\.\d s\] (.+) done$")


def _done(stderr: str) -> list[str]:
    return [m.group(1) for line in stderr.splitlines() if (m := LINE.match(line))]


def test_compare_prints_one_line_per_policy_on_stderr_when_not_a_terminal() -> None:
    args = ["compare", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp,wfbp,dear", "-n", "2", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert _done(result.stderr) == ["compare: ddp", "compare: wfbp", "compare: dear"]
    assert "done" not in result.stdout  # the JSON stays clean


def test_simulate_tune_prints_its_search_as_one_line() -> None:
    args = ["simulate", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "dear", "-n", "4", "--tune", "--trials", "3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert _done(result.stderr) == ["tune dear: 3 trials"]


def test_a_phase_ends_when_the_description_changes_or_the_task_completes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with PlainProgress() as bar:
        task = bar.add_task("starting", total=4)
        for description in ("1gbit: dear repeat 1/2", "1gbit: dear repeat 1/2", "1gbit: ddp repeat 1/2"):
            bar.update(task, advance=1, description=description)
        assert _done(capsys.readouterr().err) == ["1gbit: dear repeat 1/2"]
        bar.update(task, advance=1, description="1gbit: dear repeat 2/2")  # the last step: complete
        assert _done(capsys.readouterr().err) == ["1gbit: ddp repeat 1/2", "1gbit: dear repeat 2/2"]
    assert capsys.readouterr().err == ""  # reported once


def test_an_unfinished_phase_is_reported_when_the_block_ends_but_not_after_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with PlainProgress() as bar:
        bar.update(bar.add_task("probe", total=None), advance=1, description="64 KiB")
    assert _done(capsys.readouterr().err) == ["64 KiB"]
    with pytest.raises(KeyboardInterrupt), PlainProgress() as bar:
        bar.update(bar.add_task("probe", total=None), advance=1, description="64 KiB")
        raise KeyboardInterrupt
    assert capsys.readouterr().err == ""
