"""Where a ``commsched bench --plan`` run's time went, measured against predicted, per rank and phase.

    python benchmarks/hetero_breakdown.py OUT [--config plan|proportional_dp]

OUT is the directory ``commsched bench --plan ... --out OUT`` wrote. From the
runtime's trace of the configuration's first repeat (``trace-<config>.json``)
and, for the plan, the simulator's (``trace-plan-predicted.json``), per rank
(per worker class where predicted; the simulator merges ranks of one class)
the medians over the steady iterations of:

* ``forward``, ``backward``: the sums of the layers' forward and backward
  intervals (backward includes what communication's CPU work took from it);
* each communication task's duration (launch to completion);
* ``iteration``: one forward start to the next.

Then the reference row: the plan's compute alone against the simulator's
compute of the slowest rank (``hetero.json``'s ``plan_compute``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path

from commsched.trace import COMM_KINDS, Trace


def breakdown(trace: Trace, skip: int) -> dict[int, dict[str, float]]:
    """Per worker: median per iteration of forward, backward, each communication task and the iteration."""
    first = min(e.iteration for e in trace.events)
    sums: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    starts: dict[int, dict[int, float]] = defaultdict(dict)
    for e in trace.events:
        if e.iteration < first + skip:
            continue
        key = e.task if e.kind in COMM_KINDS else e.kind
        sums[e.worker][key][e.iteration] += e.duration_s * 1e3
        if e.kind == "forward":
            starts[e.worker][e.iteration] = min(starts[e.worker].get(e.iteration, e.start_s), e.start_s)
    out: dict[int, dict[str, float]] = {}
    for worker, phases in sorted(sums.items()):
        row = {key: statistics.median(per.values()) for key, per in phases.items() if key not in ("wait", "loss")}
        s = [starts[worker][k] for k in sorted(starts[worker])]
        if len(s) > 1:
            row["iteration"] = statistics.median((b - a) * 1e3 for a, b in itertools.pairwise(s))
        out[worker] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the --out directory of `commsched bench --plan`")
    parser.add_argument("--config", default="plan", choices=("plan", "proportional_dp"))
    parser.add_argument("--skip", type=int, default=3, help="leading iterations left out (warm-up; default 3)")
    args = parser.parse_args()
    report = json.loads((args.out / "hetero.json").read_text())
    sizes = report["batch_sizes"][args.config]
    measured = breakdown(Trace.load(args.out / f"trace-{args.config}.json"), args.skip)
    predicted_path = args.out / "trace-plan-predicted.json"
    predicted = breakdown(Trace.load(predicted_path), 1) if args.config == "plan" and predicted_path.exists() else {}
    keys = sorted({k for row in measured.values() for k in row}, key=lambda k: (k != "forward", k != "backward", k))
    print(f"{args.config}: ms per iteration, medians (measured | predicted for the rank's worker class)")
    print(f"{'rank':>4} {'batch':>5}  " + "  ".join(f"{k:>20}" for k in keys))
    classes = Trace.load(predicted_path).meta.get("classes", []) if predicted else []
    representative = {r: ranks[0] for ranks in classes for r in ranks}
    for rank, row in measured.items():
        cls = predicted.get(representative.get(rank, rank), {})
        cells = [f"{row.get(k, float('nan')):9.0f} | " + (f"{cls[k]:8.0f}" if k in cls else f"{'—':>8}") for k in keys]
        print(f"{rank:>4} {sizes[rank]:>5}  " + "  ".join(cells))
    ref = report["summary"].get("plan_compute")
    if ref is not None:
        print(
            f"plan's compute alone: measured {ref['median_ms']:.0f} ms, predicted {ref['predicted_ms']:.0f} ms "
            f"({ref['error_pct']:+.1f} %)"
        )


if __name__ == "__main__":
    main()
