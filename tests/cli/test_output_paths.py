"""Every file a command writes may be in a folder that does not exist yet: the folder is made."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from commsched.cli import cli
from commsched.cli.inputs import OutputFile


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        out[prefix + name] = command
        if isinstance(command, click.Group):
            out.update(_commands(command, f"{prefix}{name} "))
    return out


def test_simulate_writes_trace_and_timeline_into_folders_it_creates(tmp_path: Path) -> None:
    trace, png = tmp_path / "sub" / "dir" / "t.json", tmp_path / "plots" / "t.png"
    args = ["simulate", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "-n", "2"]
    result = CliRunner().invoke(cli, [*args, "--trace", str(trace), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_compare_writes_its_bar_chart_into_a_folder_it_creates(tmp_path: Path) -> None:
    png = tmp_path / "a" / "b" / "bars.png"
    args = ["compare", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "-n", "2", "--plot", str(png)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_folder_that_cannot_be_made_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    trace = tmp_path / "file" / "t.json"
    args = ["simulate", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "--trace", str(trace)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "cannot create the folder" in result.output
    assert not isinstance(result.exception, OSError)


def test_every_file_option_of_every_command_makes_its_folder() -> None:
    """``--out``, ``--plot``, ``--trace``, ``--cluster-out``, ...: every option naming a file to write."""
    writers = {}
    for name, command in _commands(cli).items():
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.Path) and not param.type.exists:
                writers[f"{name} {param.opts[0]}"] = param.type
    assert {"simulate --trace", "simulate --plot", "compare --plot", "profile --out"} <= set(writers)
    folders = {k for k, t in writers.items() if not t.file_okay}  # bench --out: a folder, made by run_bench
    assert all(isinstance(t, OutputFile) for k, t in writers.items() if k not in folders), writers
