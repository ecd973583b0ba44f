"""The rounds of DLCP tails runs beside the garbage collector's full passes during them.

    python benchmarks/dlcp_gc_ab.py benchmarks/results/dlcp-gc-ab/{base-1,new-1,base-2,new-2}

Each RUN is a ``benchmarks/dlcp_tails.py --methods dlcp`` output folder with the passes its processes logged
(``benchmarks/gc_log``) in ``RUN/gc/log.*``. Prints one Markdown row per run and scenario: the profiled compute,
p50, p99, p99.9 and the longest round, the rounds longer than the median + 50 ms, and the full passes logged
while the timed rounds ran (the processes' start-up and tear-down passes left out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from commsched.bench.tails import round_times

SLOW_MS = 50.0


def passes(run: Path) -> list[tuple[float, float]]:
    """(time.monotonic at its end, ms) of every logged full pass of the run's processes."""
    out = []
    for log in sorted((run / "gc").glob("log.*")):
        for line in log.read_text().splitlines():
            end_s, ms, *_ = line.split()
            out.append((float(end_s), float(ms)))
    return out


def rows(run: Path) -> list[str]:
    report = json.loads((run / "tails.json").read_text())
    warmup, compute = report["meta"]["config"]["warmup"], report["meta"]["compute_ms"]
    logged, out = passes(run), []
    for scenario in report["scenarios"]:
        ranks = [json.loads(p.read_text()) for p in sorted((run / scenario / "dlcp").glob("rank*.json"))]
        t = np.array(round_times(ranks, warmup)["round_ms"])
        lo = min(r["starts_s"][warmup] for r in ranks)
        hi = max(r["ends_s"][-1] for r in ranks)
        during = sorted(ms for end_s, ms in logged if lo < end_s < hi)
        p50 = float(np.median(t))
        out.append(
            f"| {run.name} | {scenario} | {compute:.1f} | {p50:.1f} | {np.percentile(t, 99):.1f} | "
            f"{np.percentile(t, 99.9):.1f} | {t.max():.1f} | {int((t > p50 + SLOW_MS).sum())} | "
            + (", ".join(f"{ms:.1f}" for ms in during) or "none")
            + " |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="dlcp_tails.py output folders with gc/log.* in each")
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "tails.json").is_file():
            parser.error(f"{run}: no tails.json (not a dlcp_tails.py output folder)")
    print("| run | scenario | compute ms a round (profiled) | p50 | p99 | p99.9 | max | rounds > p50 + 50 ms | "
          "full passes during the rounds, ms |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for run in args.runs:
        print("\n".join(rows(run)))


if __name__ == "__main__":
    main()
