"""How the plans ``auto`` kept ran against best DDP, grouped by what its trials measured, over saved reports.

    python benchmarks/kept_plans.py [REPORT ...]     # default: every saved report with ``auto`` runs

For every repeat of ``auto`` with a record of its trials: its median iteration over best DDP's of the same
repeat (the fastest DDP configuration of the session, as the tables name it). Grouped per link into: DDP's
schedule kept; another plan kept where a trial measured DDP's schedule; another plan kept where none did
(the trials ended without it, or the run predates the reference trial). Prints per group the number of
repeats and the median ratio. Which knobs the ``ddp`` trial had is not looked at.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from commsched.bench.report import shaping
from commsched.bench.summary import resummarise

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = ("DDP's schedule kept", "another kept, a ddp trial measured", "another kept, no ddp trial")


def ratios(report: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(link, group, auto's median ÷ best DDP's of the same repeat) per repeat with a record of its trials."""
    out: list[tuple[str, str, float]] = []
    if not any("auto" in session.get("runs", {}) for session in report.get("sessions", [])):
        return out  # read once, summarised only where there is something to read
    for session in resummarise(report)["sessions"]:
        runs = session["runs"]
        best = session.get("best_ddp")
        if "auto" not in runs or best not in runs:
            continue
        best_ms = {r["repeat"]: r["iteration_ms"] for r in runs[best]}
        for run in runs["auto"]:
            trials = run.get("trials")
            if not trials or run["repeat"] not in best_ms:
                continue
            if run["plan"]["policy"] == "ddp":
                group = GROUPS[0]
            else:
                group = GROUPS[1] if any(t["policy"] == "ddp" for t in trials) else GROUPS[2]
            out.append((shaping(session), group, run["iteration_ms"] / best_ms[run["repeat"]]))
    return out


def table(paths: list[Path]) -> list[str]:
    grouped: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in paths:
        for link, group, ratio in ratios(json.loads(path.read_text())):
            grouped[(link, group)].append(ratio)
    lines = ["| link | kept | repeats | auto ÷ best DDP (median) |", "|---|---|---:|---:|"]
    for (link, group), values in sorted(grouped.items(), key=lambda kv: (kv[0][0], GROUPS.index(kv[0][1]))):
        lines.append(f"| {link} | {group} | {len(values)} | {statistics.median(values):.3f} |")
    return lines


def saved_reports() -> list[Path]:
    return sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("*/bench.json"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, help="bench.json files (default: every saved one)")
    args = parser.parse_args(argv)
    print("\n".join(table(args.reports or saved_reports())))


if __name__ == "__main__":
    main()
