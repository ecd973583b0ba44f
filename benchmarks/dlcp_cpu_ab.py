"""An interleaved A/B of DLCP in training: per run, iteration times of ``ps`` and ``dlcp`` and the I/O threads' CPU.

    python benchmarks/dlcp_cpu_ab.py benchmarks/results/dlcp-cpu-ab/*.json

Each report is one ``commsched bench --policies ps,dlcp`` run (one session,
one repeat) of one tree (BENCHMARKS.md, "Again, with the data path's CPU
cut", has the commands); prints one Markdown row per run: the median
iteration ms of ``ps`` and ``dlcp``, their ratio, the ``dlcp-io`` threads'
CPU ms per iteration on ranks 0 and 1, and rank 1's decision thread's
(``cs-follow-r1``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def row(path: Path) -> str:
    (session,) = json.loads(path.read_text())["sessions"]
    runs = session["runs"]
    ps, dlcp = (statistics.median(r["iteration_ms"] for r in runs[p]) for p in ("ps", "dlcp"))
    cpu = runs["dlcp"][0]["thread_cpu_ms"]
    io = [next(ms for name, ms in rank.items() if name.startswith("dlcp-io")) for rank in cpu]
    follow = cpu[1].get("cs-follow-r1", 0.0)
    return f"| {path.stem} | {ps:.0f} | {dlcp:.0f} | {dlcp / ps:.2f} | {io[0]:.1f} / {io[1]:.1f} | {follow:.1f} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="bench.json files, one run each")
    args = parser.parse_args(argv)
    for path in sorted(args.reports):
        print(row(path))


if __name__ == "__main__":
    main()
