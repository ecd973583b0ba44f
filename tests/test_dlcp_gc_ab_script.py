"""benchmarks/dlcp_gc_ab.py reads the saved runs into BENCHMARKS.md's table; benchmarks/gc_log logs full passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [ROOT / "benchmarks" / "results" / "dlcp-gc-ab" / run for run in ("base-1", "new-1", "base-2", "new-2")]


def _cell(row: str, column: int) -> str:
    return row.split("|")[column + 1].strip()


def test_the_table_in_benchmarks_md_is_the_saved_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dlcp_gc_ab.py"), *map(str, RUNS)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.strip().splitlines()
    assert len(rows) == 2 + 2 * len(RUNS)
    assert done.stdout.strip() in (ROOT / "BENCHMARKS.md").read_text()
    for row in rows[2:]:  # what the section says of them: long passes before the freeze, short after
        longest = max(float(ms) for ms in _cell(row, 8).split(", "))
        assert (longest > 100) if _cell(row, 0).startswith("base") else (longest < 50), row


def test_the_hook_logs_each_full_pass_of_a_process(tmp_path: Path) -> None:
    env = os.environ | {"GC_LOG_DIR": str(tmp_path), "PYTHONPATH": str(ROOT / "benchmarks" / "gc_log")}
    done = subprocess.run([sys.executable, "-c", "import gc; gc.collect(); gc.collect()"], env=env, timeout=60)
    assert done.returncode == 0
    lines = [line.split() for log in tmp_path.glob("log.*") for line in log.read_text().splitlines()]
    assert len(lines) >= 2 and all(len(fields) == 4 and float(fields[1]) >= 0 for fields in lines), lines


def test_a_folder_that_is_not_a_run_is_refused_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dlcp_gc_ab.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and f"{tmp_path}: no tails.json" in done.stderr
