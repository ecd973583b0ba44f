"""benchmarks/gloo_idle_wakeups.py: a short run prints one row per number of live groups; bad input refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "gloo_idle_wakeups.py")


def test_each_group_adds_an_event_loop_that_wakes_while_idle() -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, "--groups", "2", "--seconds", "0.5"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"\| \d \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2"], done.stdout
    loops = [float(re.search(r"gloo_tcp_loop (\d+)", row).group(1)) for row in rows]  # type: ignore[union-attr]
    # 10 ms epoll timeouts: about 100 a second per group, however loaded the host (a loaded host wakes less often)
    assert 20 < loops[0] < 150 and loops[1] > loops[0] + 20, loops


def test_bad_arguments_are_refused_naming_the_flag() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--groups", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--groups: must be >= 1, got 0" in done.stderr
