"""Per rank, how long the communication tasks of a measured trace took: p50/p90/p99 and the share that took
longer than a threshold (default 150 ms: a TCP retransmission timeout on Linux's defaults).

A follower that waits for its leader's orders starts its half of a task late, so the leader's half of the
same task takes long while the follower's is short: the rank asymmetry this prints is what located the
stalls of docs/dlcp.md, "Small messages under loss".

    python benchmarks/task_tails.py TRACE.json [TRACE.json ...] [--over-ms 150]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def tails(path: Path, over_ms: float) -> list[str]:
    events = json.loads(path.read_text())["traceEvents"]
    comm = [e for e in events if e.get("ph") == "X" and e.get("tid") == "communication"]
    lines = []
    for rank in sorted({e["pid"] for e in comm}):
        ms = sorted(e["dur"] / 1e3 for e in comm if e["pid"] == rank)
        q = statistics.quantiles(ms, n=100, method="inclusive")
        slow = sum(d > over_ms for d in ms) / len(ms)
        lines.append(
            f"{path.name}  rank {rank}: {len(ms)} tasks, p50 {q[49]:.1f} ms, p90 {q[89]:.1f}, p99 {q[98]:.1f}, "
            f"max {ms[-1]:.1f}; over {over_ms:g} ms: {100 * slow:.1f} %"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--over-ms", type=float, default=150.0)
    args = parser.parse_args()
    for path in args.traces:
        print("\n".join(tails(path, args.over_ms)))


if __name__ == "__main__":
    main()
