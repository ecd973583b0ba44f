"""An interleaved A/B of DLCP in training: per run, iteration times of ``ps`` and ``dlcp`` and the I/O threads' CPU.

    python benchmarks/dlcp_cpu_ab.py benchmarks/results/dlcp-cpu-ab/*.json

Each report is one ``commsched bench --policies ps,dlcp`` run (one session,
one repeat) of one tree (BENCHMARKS.md, "Again, with the data path's CPU
cut", has the commands); prints one Markdown row per run: the median
iteration ms of ``ps`` and ``dlcp``, their ratio, the ``dlcp-io`` threads'
CPU ms per iteration on ranks 0 and 1, and rank 1's decision thread's
(``cs-follow-r1``). ``--summary`` adds one line: the median, range and
count within 1.05 of ``dlcp / ps`` over all the reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def medians(path: Path) -> tuple[float, float]:
    """``ps``'s and ``dlcp``'s median iteration ms over the report's repeats."""
    (session,) = json.loads(path.read_text())["sessions"]
    ps, dlcp = (statistics.median(r["iteration_ms"] for r in session["runs"][p]) for p in ("ps", "dlcp"))
    return ps, dlcp


def row(path: Path) -> str:
    (session,) = json.loads(path.read_text())["sessions"]
    runs = session["runs"]
    ps, dlcp = medians(path)
    cpu = runs["dlcp"][0]["thread_cpu_ms"]
    io = [next(ms for name, ms in rank.items() if name.startswith("dlcp-io")) for rank in cpu]
    follow = cpu[1].get("cs-follow-r1", 0.0)
    return f"| {path.stem} | {ps:.0f} | {dlcp:.0f} | {dlcp / ps:.2f} | {io[0]:.1f} / {io[1]:.1f} | {follow:.1f} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="bench.json files, one run each")
    parser.add_argument("--summary", action="store_true", help="also: dlcp / ps over all the reports, one line")
    args = parser.parse_args(argv)
    for path in sorted(args.reports):
        print(row(path))
    if args.summary:
        ratios = sorted(dlcp / ps for ps, dlcp in map(medians, args.reports))
        within = sum(r <= 1.05 for r in ratios)
        print(f"dlcp / ps over {len(ratios)} reports: median {statistics.median(ratios):.2f} "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f}), at most 1.05 in {within}")  # fmt: skip


if __name__ == "__main__":
    main()
