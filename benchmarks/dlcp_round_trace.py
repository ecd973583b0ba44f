"""Where a DLCP exchange's time goes, round by round: a tails run beside the events its ranks traced.

    DLCP_TRACE_DIR=RUN/trace PYTHONPATH=benchmarks/dlcp_trace:src python benchmarks/dlcp_tails.py \\
        --senders 2 --rounds 100 --mtu 9000 --methods dlcp,gloo --scenarios lossless,loss --out RUN
    python benchmarks/dlcp_round_trace.py RUN

RUN is a ``benchmarks/dlcp_tails.py`` output folder whose ``dlcp`` ranks ran with ``benchmarks/dlcp_trace`` on
PYTHONPATH (their traces in ``RUN/trace``, as written or gzipped). Prints one Markdown row per scenario and
sender: medians over the timed rounds of when, after the rank's exchange started, its first transfer was
posted and its first datagram handed to the kernel; when the first datagram arrived after the first peer's
exchange started; the payload rate from the first arrival to the last; how long after the last arrival the
exchange ended; the exchange; and gloo's exchange on the same rank where the run has one. On a link that is
the bottleneck, what the exchange takes beyond the payload at the link's rate is the start, the end, and any
stretch of the middle below the rate.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np


def load_traces(folder: Path) -> list[dict[str, Any]]:
    """Every trace in ``folder`` (``rank`` and ``events``), as written or gzipped."""
    out = []
    for path in sorted(folder.glob("trace.*.json*")):
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        out.append(json.loads(text))
    return out


def _exchanges_ms(folder: Path, warmup: int) -> dict[int, float]:
    """Each sender's median exchange (its start to its end) over the timed rounds, by rank."""
    out = {}
    for path in sorted(folder.glob("rank*.json")):
        r = json.loads(path.read_text())
        if not r.get("server"):
            out[r["rank"]] = float(np.median(np.subtract(r["ends_s"], r["comm_starts_s"])[warmup:]) * 1e3)
    return out


def breakdown(ranks: list[dict[str, Any]], events: dict[int, list[list[Any]]], warmup: int) -> dict[int, dict]:
    """Per sender, the medians over the timed rounds (all but the last, whose events may be cut short)."""
    senders = [r for r in ranks if not r.get("server")]
    out = {}
    for r in senders:
        ev = events.get(r["rank"])
        if ev is None:
            raise ValueError(f"no trace of rank {r['rank']}")
        posts = np.array([e[1] for e in ev if e[0] == "p"])
        sent = np.array([e[1] for e in ev if e[0] == "s"])
        reads = np.array([(e[1], e[2]) for e in ev if e[0] == "r"])
        rows = []
        for i in range(warmup, len(r["ends_s"]) - 1):
            start, end = r["comm_starts_s"][i], r["ends_s"][i]
            first_peer = min(p["comm_starts_s"][i] for p in senders if p is not r)
            inside = reads[(reads[:, 0] >= min(start, first_peer)) & (reads[:, 0] <= end)]
            mine = posts[(posts >= start) & (posts <= end)]
            out_of = sent[(sent >= start) & (sent <= end)]
            if not len(inside) or not len(mine) or not len(out_of):
                continue
            span = inside[-1, 0] - inside[0, 0]
            rows.append((
                (mine[0] - start) * 1e3,
                (out_of[0] - start) * 1e3,
                (inside[0, 0] - first_peer) * 1e3,
                inside[1:, 1].sum() * 8 / span / 1e6 if span > 0 else float("nan"),
                (end - inside[-1, 0]) * 1e3,
                (end - start) * 1e3,
            ))  # fmt: skip
        if not rows:
            raise ValueError(f"rank {r['rank']}: no timed round with traced events")
        med = np.nanmedian(np.array(rows), axis=0)
        names = ("posted_ms", "sent_ms", "arrived_ms", "rate_mbit_s", "end_ms", "exchange_ms")
        out[r["rank"]] = dict(zip(names, map(float, med), strict=True)) | {"rounds": len(rows)}
    return out


def rows(run: Path) -> list[str]:
    report = json.loads((run / "tails.json").read_text())
    warmup = report["meta"]["config"]["warmup"]
    found = load_traces(run / "trace")
    if not found:
        raise ValueError(f"{run / 'trace'}: no trace.*.json (run with benchmarks/dlcp_trace on PYTHONPATH)")
    out = []
    for scenario in report["scenarios"]:
        folder = run / scenario / "dlcp"
        if not folder.is_dir():
            continue
        ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
        # a scenario's traces: those whose first post falls within its rounds (each launch is a new process)
        lo, hi = min(r["starts_s"][0] for r in ranks), max(r["ends_s"][-1] for r in ranks)
        events = {}
        for trace in found:
            first = next((e[1] for e in trace["events"] if e[0] == "p"), None)
            if first is not None and lo <= first <= hi:
                events[trace["rank"]] = trace["events"]
        gloo = _exchanges_ms(run / scenario / "gloo", warmup) if (run / scenario / "gloo").is_dir() else {}
        for rank, b in sorted(breakdown(ranks, events, warmup).items()):
            reference = f"{gloo[rank]:.2f}" if rank in gloo else "-"
            out.append(
                f"| {scenario} | {rank} | {b['posted_ms']:.2f} | {b['sent_ms']:.2f} | {b['arrived_ms']:.2f} | "
                f"{b['rate_mbit_s']:.0f} | {b['end_ms']:.2f} | {b['exchange_ms']:.2f} | {reference} |"
            )
    return out


HEADER = (
    "| scenario | rank | first post (ms) | first datagram sent | first arrival after the peer's start | "
    "payload rate, first to last arrival (Mbit/s) | end after the last arrival | exchange | gloo's exchange |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a dlcp_tails.py output folder with the ranks' traces in RUN/trace")
    args = parser.parse_args()
    if not (args.run / "tails.json").is_file():
        parser.error(f"{args.run}: no tails.json (not a dlcp_tails.py output folder)")
    try:
        lines = rows(args.run)
    except ValueError as exc:
        parser.error(str(exc))
    print(HEADER)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
