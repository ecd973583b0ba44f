"""Markdown tables (as in BENCHMARKS.md) and the bar chart from a ``commsched bench`` result.

    python benchmarks/testbed_tables.py bench-results/bench.json [--png out.png]

Prints the machine, the command line, and per link shaping the measured link
check and one table: policies, default DDP and best DDP, then the references;
the DDP grid (every configuration measured; results saved before the grid
have none); with ``--phases`` where each step's time goes; for a
``--validate`` run, the simulator's predictions beside the measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from commsched.bench.calibrate import revalidate
from commsched.bench.plot import plot
from commsched.bench.report import grid_markdown, markdown_table, phase_table, shaping, validation_markdown
from commsched.bench.summary import resummarise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="bench.json written by commsched bench")
    parser.add_argument("--png", type=Path, help="also draw the bar chart here")
    parser.add_argument("--phases", action="store_true", help="also where each step's time goes")
    args = parser.parse_args()
    report = resummarise(json.loads(args.report.read_text()))  # today's definitions, from the raw times
    report = revalidate(report)  # today's simulator and α-β fit, from the raw calibration
    meta = report["meta"]
    m = meta["machine"]
    print(f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, Linux {m['kernel']}, Python {m['python']}, torch {m['torch']}")
    print(f"Testbed: {meta['testbed']['description']}")
    print(f"Command: `{meta['command_line']}` ({meta['wall_s'] / 60:.1f} min)")
    print(f"Load average at start / end: {m['load_average'][0]:.1f} / {meta['load_average_end'][0]:.1f}")
    print()
    for session in report["sessions"]:
        check = session.get("link_check")
        line = f"**links {shaping(session)}**"
        if check:
            line += f" (TCP check: {check['throughput_mbit_s']:.0f} Mbit/s, RTT {check['rtt_ms']:.2f} ms)"
        load = session.get("load_average"), session.get("load_average_end")
        if all(load):
            line += f", load average {load[0][0]:.1f} → {load[1][0]:.1f}"  # type: ignore[index]
        print(line)
        print()
        print(markdown_table(report, session))
        print()
        grid = grid_markdown(session)
        if grid:
            print(grid)
            print()
        if args.phases:
            print(phase_table(report, session))
            print()
    validation = validation_markdown(report)
    if validation:
        print("**Simulator validation** (predicted / measured iteration ms, error)")
        print()
        print(validation)
        print()
        errors = [
            abs(row["error_pct"])
            for session in report["sessions"]
            if "validation" in session
            for name, row in session["validation"]["rows"].items()
            if name in meta["config"]["policies"] and "error_pct" in row
        ]
        print(f"Median |error| over every policy and shaping: {statistics.median(errors):.1f} % ({len(errors)} cases)")
        print()
    if args.png:
        plot(report, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
