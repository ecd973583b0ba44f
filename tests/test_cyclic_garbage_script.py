"""benchmarks/cyclic_garbage.py: a short run counts each policy's cyclic garbage; bad input refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "cyclic_garbage.py")


@pytest.mark.multiproc
def test_a_short_run_counts_the_garbage_of_each_policy() -> None:
    args = ["--policies", "ps,dlcp", "--warmup", "12", "--iters", "5"]
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for policy in ("ps", "dlcp"):
        line = re.search(rf"^{policy}: ([\d.]+) objects of cyclic garbage per iteration", done.stdout, re.M)
        assert line is not None, done.stdout
        # an ended transfer refers to nothing that refers back to it (a cycle per transfer was 371 a dlcp iteration)
        assert float(line.group(1)) < 1.0, line.group(0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "nope"], "--policies: unknown policy ['nope']"),
        (["--model", "nope"], "--model: unknown model 'nope'"),
        (["--iters", "0"], "--iters must be at least 1 and --warmup at least 0, got 0 and 30"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
