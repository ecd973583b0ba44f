"""Each thread's CPU and wait for a core per timed iteration, per configuration and rank, of a bench report.

    python benchmarks/thread_cpu.py benchmarks/results/RUN/bench.json

Prints one Markdown table per session: the median over repeats of the CPU ms
per iteration that each thread name used on each rank (the interpreter's
name: the training thread; ``cs-*``: the runtime's own threads, in reports
made since they are named; ``gloo_tcp_loop``: gloo's socket loops;
``pt_gloo_runloop``: its work threads), beside the iteration time. Reports
made before the bench recorded threads (no ``thread_cpu_ms``) print nothing
for those runs. Reports that recorded each thread's run-queue delay
(``thread_wait_ms``: time runnable while other threads held the cores) get a
second table of those, and those that counted each thread's sleeps
(``thread_sleeps``: voluntary context switches, each a wake-up to come) a
third.

    python benchmarks/thread_cpu.py --totals [--only CONFIGURATION] A.json B.json ...

prints instead one row per report, session and configuration: per rank, the
training thread's wait for a core and the sleeps of the training thread and
the runtime's own threads together (gloo's left out), medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from commsched.bench.report import shaping

#: the training thread's name in the readings: the interpreter's
TRAINING = "python3"


def table(session: dict[str, Any], key: str = "thread_cpu_ms", what: str = "CPU ms per iteration") -> str:
    """The Markdown table of one session's ``key`` readings (configurations without them left out)."""
    rows = []
    for name, runs in session["runs"].items():
        readings = [r[key] for r in runs if r.get(key)]
        if not readings:
            continue
        world = len(readings[0])
        names = sorted({n for reading in readings for rank in reading if rank for n in rank})
        cells = []
        for rank in range(world):
            per_name = {n: statistics.median((reading[rank] or {}).get(n, 0.0) for reading in readings) for n in names}
            cells.append(", ".join(f"{n} {ms:.1f}" for n, ms in sorted(per_name.items(), key=lambda kv: -kv[1]) if ms))
        iteration = statistics.median(r["iteration_ms"] for r in runs)
        rows.append(f"| {name} | {iteration:.0f} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    world = rows[0].count("|") - 3
    head = "| configuration | iter ms | " + " | ".join(f"rank {r}: {what}" for r in range(world)) + " |"
    return "\n".join([head, "|---" * (world + 2) + "|", *rows])


def totals(path: Path, session: dict[str, Any], only: str | None = None) -> list[str]:
    """Rows of ``--totals`` for one session (configurations that counted sleeps; ``only``: that one)."""
    rows = []
    for name, runs in session["runs"].items():
        runs = [r for r in runs if r.get("thread_sleeps") and r.get("thread_wait_ms") and only in (None, name)]
        if not runs:
            continue
        cells = []
        for rank in range(len(runs[0]["thread_sleeps"])):
            wait = statistics.median((r["thread_wait_ms"][rank] or {}).get(TRAINING, 0.0) for r in runs)
            counted = [(r["thread_sleeps"][rank] or {}).items() for r in runs]
            sleeps = statistics.median(
                sum(n for thread, n in reading if thread == TRAINING or thread.startswith("cs-")) for reading in counted
            )
            cells.append(f"{wait:.0f} ms, {sleeps:.0f}")
        iteration = statistics.median(r["iteration_ms"] for r in runs)
        report = f"{path.parent.name}/{path.stem}"
        rows.append(f"| {report} | {shaping(session)} | {name} | {iteration:.0f} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="bench.json files of `commsched bench`")
    parser.add_argument("--totals", action="store_true", help="one row per configuration (module docstring)")
    parser.add_argument("--only", help="with --totals: the rows of this configuration only")
    args = parser.parse_args()
    if args.totals:
        print("| report | link | configuration | iter ms | rank 0: training thread's wait for a core, sleeps "
              "(training + runtime threads) per iteration | rank 1 |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for path in args.reports:
            for session in json.loads(path.read_text())["sessions"]:
                print("\n".join(totals(path, session, args.only)))
        return
    for path in args.reports:
        for session in json.loads(path.read_text())["sessions"]:
            text = table(session)
            if text:
                print(f"**links {shaping(session)}**\n\n{text}\n")
            waits = table(session, "thread_wait_ms", "ms per iteration waiting for a core")
            if waits:
                print(f"**links {shaping(session)}**, waiting for a core\n\n{waits}\n")
            sleeps = table(session, "thread_sleeps", "sleeps per iteration")
            if sleeps:
                print(f"**links {shaping(session)}**, sleeps\n\n{sleeps}\n")


if __name__ == "__main__":
    main()
