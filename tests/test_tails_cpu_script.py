"""benchmarks/tails_cpu.py: per-rank CPU and I/O-loop counters per round from a tails run's folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "tails_cpu.py")


def _run_folder(root: Path) -> Path:
    """A made-up run: one scenario, a DLCP method (2 ranks, 4 rounds of which 3 timed) and gloo (no counters)."""
    run = root / "run"
    (run / "lossless" / "dlcp").mkdir(parents=True)
    (run / "lossless" / "gloo").mkdir(parents=True)
    (run / "tails.json").write_text(json.dumps({"scenarios": {"lossless": {"methods": {"dlcp": {}, "gloo": {}}}}}))
    for method in ("dlcp", "gloo"):
        (run / "lossless" / method / "job.json").write_text(json.dumps({"rounds": 3, "warmup": 1}))
    counters = {"turns": 40, "idle_turns": 20, "host_queue_full": 8, "send_calls": 12, "recv_calls": 16,
                "sent": 100, "received": 120}  # fmt: skip
    for rank in range(2):
        dlcp = {"rank": rank, "server": False, "starts_s": [0.0] * 4, "cpu_s": 0.3, "user_s": 0.24,
                "system_s": 0.06, "waits": 90, "dlcp": counters}  # fmt: skip
        (run / "lossless" / "dlcp" / f"rank{rank}.json").write_text(json.dumps(dlcp))
        gloo = {"rank": rank, "server": False, "starts_s": [0.0] * 4, "cpu_s": 0.03}  # saved before user/kernel
        (run / "lossless" / "gloo" / f"rank{rank}.json").write_text(json.dumps(gloo))
    return run


def test_each_rank_gets_its_cpu_per_timed_round_and_its_counters_per_round(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, SCRIPT, str(_run_folder(tmp_path))], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 4
    # CPU over the 3 timed rounds; the link's counters over all 4 rounds
    assert rows[0] == ["run", "lossless", "dlcp", "0", "100.0", "80.0", "20.0", "30", "10", "5", "2", "3", "4",
                       "25", "30"]  # fmt: skip
    assert rows[2][:5] == ["run", "lossless", "gloo", "0", "10.0"] and set(rows[2][5:]) == {""}


def test_a_folder_that_is_not_a_run_is_refused_naming_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "holds no tails.json" in done.stderr and str(tmp_path) in done.stderr
