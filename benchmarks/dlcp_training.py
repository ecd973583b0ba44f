"""DLCP in training: p50/p90 iteration times of ``ps`` over TCP, ``dlcp`` and PyTorch DDP from ``commsched bench`` runs.

Reads the ``bench.json`` of each run given (a lossless run and a lossy one,
each with ``--policies ps,dlcp``; every bench session also has default DDP)
and prints, per link shaping, each policy's median iteration time and its
p50/p90 over every timed step, then the ratios the DLCP targets name
(baseline / method: above 1, DLCP faster): on lossless links ``dlcp`` at
most 1.05x ``ps`` (p50), and under loss ``dlcp`` better than ``ps`` at p90.

    sudo .venv/bin/commsched bench --model cnn --workers 2 --bandwidth 300mbit --mtu 9000 --policies ps,dlcp \\
        --iters 200 --warmup 5 --repeats 1 --no-ddp-grid --no-references --no-probe --out dlcp-train-lossless
    sudo .venv/bin/commsched bench ... --loss 1 --out dlcp-train-loss1
    python benchmarks/dlcp_training.py dlcp-train-lossless/bench.json dlcp-train-loss1/bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _policies(session: dict[str, Any]) -> tuple[str, ...]:
    return ("ps", "dlcp", session["default_ddp"])


def rows(report: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    """(session label, policy, its summary) for ps, dlcp and default DDP, where each session measured them."""
    out = []
    for session in report["sessions"]:
        for policy in _policies(session):
            summary = session["summary"].get(policy)
            if summary is not None:
                out.append((session["label"], policy, summary))
    return out


def ratio_lines(report: dict[str, Any]) -> list[str]:
    """Baseline / method per session at p50 and p90; a lossless session's ps/dlcp p50 is checked against 0.95
    (dlcp at most 1.05x ps), a lossy one's p90 against 1 (dlcp better)."""
    lines = []
    for session in report["sessions"]:
        summary, lossy = session["summary"], session["shape"].get("loss_pct", 0) > 0
        if "dlcp" not in summary:
            continue
        for baseline in ("ps", session["default_ddp"]):
            if baseline not in summary:
                continue
            for stat in ("p50_ms", "p90_ms"):
                value = summary[baseline][stat] / summary["dlcp"][stat]
                line = f"{session['label']:<24} {stat[:3]} {baseline}/dlcp: {value:.2f}x"
                if baseline == "ps" and stat == ("p90_ms" if lossy else "p50_ms"):
                    floor = 1.0 if lossy else 1 / 1.05
                    line += f" (target > {floor:.2f}x: {'met' if value > floor else 'missed'})"
                lines.append(line)
    return lines


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit(__doc__)
    for path in paths:
        report = json.loads(Path(path).read_text())
        mtu = report["meta"].get("testbed", {}).get("mtu_bytes", 1500)
        print(f"{path} (MTU {mtu})")
        print(f"{'session':<24} {'policy':<12} {'median ms':>10} {'p50 ms':>8} {'p90 ms':>8} {'steps':>6}")
        for label, policy, s in rows(report):
            times = f"{s['median_ms']:>10.1f} {s['p50_ms']:>8.1f} {s['p90_ms']:>8.1f}"
            print(f"{label:<24} {policy:<12} {times} {s['steps']:>6}")
        for line in ratio_lines(report):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
