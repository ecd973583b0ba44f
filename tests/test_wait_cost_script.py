"""benchmarks/wait_cost.py: a short run prints a row per kind of wait, each wait as long as asked; bad input refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "wait_cost.py")


def test_every_kind_of_wait_gets_a_row_with_its_cpu_and_wall_time() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--waits", "20"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line[:22].strip(): line[22:].split() for line in done.stdout.splitlines()[1:]}
    assert list(rows) == ["sleep 100 us", "sleep 500 us", "epoll, 1 ms timeout", "epoll, no wait"], done.stdout
    cpu = {name: float(values[0]) for name, values in rows.items()}
    wall = {name: float(values[1]) for name, values in rows.items()}
    # a wait lasts at least as long as asked, and takes less CPU than wall time while it sleeps
    assert wall["sleep 500 us"] >= 500 and wall["epoll, 1 ms timeout"] >= 1000 and wall["sleep 100 us"] >= 100
    assert cpu["sleep 500 us"] < wall["sleep 500 us"] and cpu["epoll, 1 ms timeout"] < wall["epoll, 1 ms timeout"]


def test_bad_arguments_are_refused_naming_the_flag() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--waits", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--waits" in done.stderr and "0" in done.stderr
