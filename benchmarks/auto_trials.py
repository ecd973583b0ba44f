"""What ``auto``'s trials read against what the plan it kept then ran, repeat by repeat.

    python benchmarks/auto_trials.py benchmarks/results/testbed-gpt5m-2w-auto-300mbit-10.json

For each session and repeat of a ``commsched bench`` run with ``auto``: every trial (policy and its mean
ms per iteration over the trial, in the order measured), the trial measured a second time ("again", in runs
since ``auto`` does that: its policy and second reading), the plan kept, the kept plan's reading that decided
(the second where there is one), the median iteration of the timed run that followed, and best DDP's
median of the same repeat (the fastest DDP configuration of the session, as the tables name it). The last
line per session: the kept plans' deciding readings and their runs, as medians over the repeats, and how
much slower the runs were. A plan kept on one reading is the fastest of several noisy ones, so that
reading is biased low (the winner's curse): this shows by how much.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from commsched.bench.report import shaping
from commsched.bench.summary import resummarise


def _same(trial: dict[str, Any], plan: dict[str, Any]) -> bool:
    return bool(trial["policy"] == plan.get("policy") and trial["knobs"] == plan.get("knobs"))


def session_table(session: dict[str, Any]) -> str:
    runs = session["runs"]
    best = session["best_ddp"]
    lines = [
        f"**links {shaping(session)}** (best DDP: {best})",
        "",
        "| repeat | trials, ms per iteration (in order) | again | kept | its reading | it ran | best DDP ran |",
        "|---:|---|---|---|---:|---:|---:|",
    ]
    readings, ran = [], []
    for run in runs["auto"]:
        plan, trials = run.get("plan") or {}, run.get("trials") or []
        again = run.get("again")
        second = {again["trial"]: again["mean_ms"]} if again and again.get("mean_ms") is not None else {}
        kept = [
            second.get(i, t["mean_ms"]) for i, t in enumerate(trials) if _same(t, plan) and t.get("mean_ms") is not None
        ]
        shown = ", ".join(f"{t['policy']} {t['mean_ms']:.0f}" for t in trials if t.get("mean_ms") is not None)
        again_shown = "—" if not second else f"{trials[again['trial']]['policy']} {again['mean_ms']:.0f}"
        reference = [r["iteration_ms"] for r in runs.get(best, []) if r["repeat"] == run["repeat"]]
        reading = f"{kept[-1]:.0f}" if kept else "—"
        if kept:
            readings.append(kept[-1])
            ran.append(run["iteration_ms"])
        best_ms = f"{reference[0]:.0f}" if reference else "—"
        policy = plan.get("policy", "—")
        cells = [str(run["repeat"]), shown, again_shown, policy, reading, f"{run['iteration_ms']:.0f}", best_ms]
        lines.append("| " + " | ".join(cells) + " |")
    if readings:
        r, m = statistics.median(readings), statistics.median(ran)
        lines += [
            "",
            f"Kept plans: deciding reading {r:.0f} ms, then ran {m:.0f} ms (median over repeats; {m / r:.3f}x)",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="bench.json written by commsched bench with --policies auto")
    args = parser.parse_args()
    report = resummarise(json.loads(args.report.read_text()))
    sessions = [s for s in report["sessions"] if "auto" in s.get("runs", {})]
    if not sessions:
        parser.error(f"{args.report}: no session ran auto")
    print("\n\n".join(session_table(s) for s in sessions))


if __name__ == "__main__":
    main()
