"""benchmarks/runtime_cost.py: a tiny run on two ranks, and the saved run's table in BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from commsched._sockets import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_a_tiny_run_times_every_phase_and_counts_every_threads_cpu_and_sleeps_in_both_configurations(
    tmp_path: Path,
) -> None:
    out = tmp_path / "cost.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "runtime_cost.py"), "--configs", "torch,ddp",
            "--model", "cnn", "--iters", "3", "--warmup", "3", "--blocks", "2", "--port", str(free_port()),
            "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["ddp", "torch"]
    for name, r in results.items():
        assert all(len(v) == 3 * 2 and all(t > 0 for t in v) for v in r["times_s"].values()), name
        blocks = r["threads_ms"]  # the training thread's name is the interpreter's: python, python3, ...
        assert len(blocks) == 2 and all(any(n.startswith("python") for n in block) for block in blocks), name
        assert len(r["threads_sleeps"]) == 2, name
    # every iteration broadcasts the batch-norm buffers through gloo, whose work thread waits for each op
    for name, r in results.items():
        assert all(block.get("pt_gloo_runloop", 0) >= 1 for block in r["threads_sleeps"]), (name, r)
    assert "sleeps per thread per iteration" in done.stdout
    assert "| torch |" in done.stdout and "| ddp |" in done.stdout


def test_bad_arguments_are_refused_naming_the_flag() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "runtime_cost.py"), "--iters", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--iters: must be >= 1, got 0" in done.stderr


def test_the_saved_run_is_the_table_in_benchmarks(script_loader: Callable[[str], ModuleType]) -> None:
    module = script_loader("benchmarks/runtime_cost.py")
    report = json.loads((ROOT / "benchmarks" / "results" / "runtime-cost" / "runtime-cost.json").read_text())
    assert module.summary(report) in (ROOT / "BENCHMARKS.md").read_text()


@pytest.mark.parametrize("run", ["threads-unshaped-5", "threads-named-5"])
def test_the_saved_thread_tables_of_the_testbed_runs_are_in_benchmarks(
    script_loader: Callable[[str], ModuleType], run: str
) -> None:
    module = script_loader("benchmarks/thread_cpu.py")
    report = json.loads((ROOT / "benchmarks" / "results" / run / "bench.json").read_text())
    (session,) = report["sessions"]
    text = module.table(session)
    assert len(text.splitlines()) == 2 + 7  # header, rule, seven configurations
    assert text in (ROOT / "BENCHMARKS.md").read_text()
