"""The overlap bound of a ``commsched bench`` session beside the bound the model's structure allows.

    python benchmarks/model_bound.py benchmarks/results/testbed-gpt5m-2w-auto-300mbit-10.json

``commsched bench`` divides each configuration's time by ``max(compute in lock-step, all-reduce alone)``
(its "÷ ideal" column): what a schedule would take if every byte could overlap compute. A model whose
largest gradient is ready last and needed first (a tied embedding: ready at the very end of backward, read
by the first layer of the next forward) cannot get there: no byte of it can overlap anything. The
simulator's :func:`commsched.sim.ideal` bounds any lossless schedule of the model's own order (ready
times, forward order, one link, a collective's startup), from the same calibration the ``--validate``
predictions use (the profile and the α-β fit, fitted to the session's all-reduce alone and compute
references; never to a policy's time). Per session it prints both bounds and every configuration's time
divided by each. It is a model's figure, not a measurement: as close as the calibration's predictions are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from commsched.bench.calibrate import Calibration, fitted_to
from commsched.bench.report import shaping
from commsched.bench.summary import resummarise
from commsched.sim.ideal import ideal


def session_bounds(session: dict[str, Any]) -> tuple[float, float]:
    """``(max(compute in lock-step, all-reduce alone), the model's bound)`` of one session, in ms."""
    calibration = fitted_to(Calibration(session["calibration"], f"session {session['label']}"), session)
    model = ideal(calibration.workload, calibration.cluster, {"update_ms": calibration.update_ms}).iteration_ms
    return session["ideal_overlap_ms"], model


def table(report: dict[str, Any]) -> str:
    lines = []
    for session in report["sessions"]:
        overlap, model = session_bounds(session)
        lines += [
            f"**links {shaping(session)}**: max(compute in lock-step, all-reduce alone) {overlap:.0f} ms; "
            f"the model's bound {model:.0f} ms ({model / overlap:.3f}x)",
            "",
            "| configuration | iter ms | ÷ max(lock-step, all-reduce) | ÷ the model's bound |",
            "|---|---:|---:|---:|",
        ]
        for name, row in session["summary"].items():
            if name in ("compute", "allreduce", "compute_alone"):
                continue
            ms = row["median_ms"]
            lines.append(f"| {name} | {ms:.0f} | {ms / overlap:.2f} | {ms / model:.2f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="bench.json written by commsched bench --validate")
    args = parser.parse_args()
    report = resummarise(json.loads(args.report.read_text()))
    missing = [s["label"] for s in report["sessions"] if "calibration" not in s]
    if missing:
        parser.error(f"{args.report}: session(s) {', '.join(missing)} have no calibration (run with --validate)")
    print(table(report))


if __name__ == "__main__":
    main()
