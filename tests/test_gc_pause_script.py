"""benchmarks/gc_pause.py: a short run prints the passes before and after the freeze; bad input refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "gc_pause.py")


def test_the_freeze_takes_nearly_every_tracked_object_out_of_later_passes() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--passes", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = re.search(r"objects tracked: ([\d,]+); moved out of later passes by the freeze: ([\d,]+)", done.stdout)
    assert counts is not None, done.stdout
    tracked, frozen = (int(c.replace(",", "")) for c in counts.groups())
    assert tracked > 10_000 and frozen > 0.5 * tracked, (tracked, frozen)  # torch's objects, all kept out
    for when in ("before", "after"):
        line = re.search(rf"full pass, ms, {when} the freeze: +([\d.]+), ([\d.]+)$", done.stdout, re.M)
        assert line is not None, (when, done.stdout)


def test_bad_arguments_are_refused_naming_the_flag() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--passes", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--passes must be at least 1, got 0" in done.stderr
