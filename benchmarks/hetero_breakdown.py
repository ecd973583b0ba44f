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
compute of the slowest rank (``hetero.json``'s ``plan_compute``), and per
repeat of it (from ``hetero.json``'s per-iteration phases, so a saved run
without traces gives this part too): each rank's median forward + backward
and its coefficient of variation over the iterations, the slowest of the
ranks' medians, the median over iterations of the slowest rank in each
(lock-step: what the barrier waits for) and the iteration's median; where
the run timed each rank's reference before every repeat, the prediction at
the runs' speed and each repeat's speed factors (:mod:`commsched.bench.drift`;
per batch where the run also timed each rank's batch in the plan).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from commsched.bench.task_overlap import beside_backward
from commsched.cluster import load_cluster
from commsched.trace import COMM_KINDS, Trace, TraceEvent


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


@dataclass(frozen=True)
class ComputeAlone:
    """One repeat of the plan's compute alone (ms; ``cv``: standard deviation over mean, per rank)."""

    repeat: int
    medians_ms: list[float]
    cv: list[float]
    slowest_median_ms: float
    slowest_each_ms: float
    iteration_ms: float


def compute_alone(report: dict, skip: int) -> list[ComputeAlone]:
    """Per repeat of ``plan_compute``: per-rank medians and spreads of forward + backward, and the straggler's."""
    per: dict[int, dict[int, list[float]]] = defaultdict(dict)
    iteration: dict[int, list[float]] = {}
    for rank in report["runs"]:
        for run in rank["runs"]:
            if run["name"] != "plan_compute":
                continue
            phases = run["phases_s"]
            both = [(f + b) * 1e3 for f, b in zip(phases["forward"], phases["backward"], strict=True)][skip:]
            per[run["repeat"]][rank["rank"]] = both
            iteration[run["repeat"]] = [t * 1e3 for t in run["times_s"][skip:]]
    out = []
    for repeat, ranks in sorted(per.items()):
        times = [ranks[r] for r in sorted(ranks)]
        medians = [statistics.median(t) for t in times]
        out.append(
            ComputeAlone(
                repeat=repeat,
                medians_ms=medians,
                cv=[statistics.pstdev(t) / statistics.fmean(t) for t in times],
                slowest_median_ms=max(medians),
                slowest_each_ms=statistics.median(max(each) for each in zip(*times, strict=True)),
                iteration_ms=statistics.median(iteration[repeat]),
            )
        )
    return out


def overlap_paid(report: dict, trace: Trace, skip: int) -> dict[int, tuple[float, float, float]]:
    """Per rank, in the traced repeat: (the plan's backward over the compute alone's, in ms; the tasks that
    started inside it; the MiB they moved meanwhile), each the median over the steady iterations."""
    first = min(e.iteration for e in trace.events)
    alone: dict[int, float] = {}
    for rank in report["runs"]:
        for run in rank["runs"]:
            if run["name"] == "plan_compute" and run["repeat"] == 0:  # the runtime traces repeat 0
                alone[rank["rank"]] = statistics.median(run["phases_s"]["backward"][skip:]) * 1e3
    by_step: dict[tuple[int, int], list[TraceEvent]] = defaultdict(list)
    for e in trace.events:
        if e.iteration >= first + skip:
            by_step[(e.worker, e.iteration)].append(e)
    rows: dict[int, list[tuple[float, int, float]]] = defaultdict(list)
    for (worker, iteration), events in sorted(by_step.items()):
        row = beside_backward(events, worker, iteration)
        if row is not None:
            rows[worker].append(row)
    out = {}
    for worker, per in rows.items():
        if worker in alone:
            ms, tasks, mib = (statistics.median(col) for col in zip(*per, strict=True))
            out[worker] = (ms - alone[worker], tasks, mib)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the --out directory of `commsched bench --plan`")
    parser.add_argument("--config", default="plan", choices=("plan", "proportional_dp"))
    parser.add_argument("--skip", type=int, default=3, help="leading iterations left out (warm-up; default 3)")
    args = parser.parse_args()
    report = json.loads((args.out / "hetero.json").read_text())
    traced = args.out / f"trace-{args.config}.json"
    if traced.exists():
        _print_traces(args, report, traced)
    else:
        print(f"{args.config}: no {traced.name} (a saved run keeps hetero.json only): per-rank phases left out")
    ref = report["summary"].get("plan_compute")
    if ref is not None:
        print(
            f"plan's compute alone: measured {ref['median_ms']:.0f} ms, predicted {ref['predicted_ms']:.0f} ms "
            f"({ref['error_pct']:+.1f} %)"
        )
        if "predicted_at_run_ms" in ref:
            at_run, error = ref["predicted_at_run_ms"], ref["error_at_run_pct"]
            print(f"  at the runs' speed: predicted {at_run:.0f} ms ({error:+.1f} %)")
        for repeat, factors in enumerate(report["measured"].get("speed_factors", [])):
            cells = " ".join(f"{f:.3f}" for f in factors)
            print(f"  repeat {repeat}: speed factor per rank {cells} (reference before the repeat over calibration)")
        for repeat, per_rank in enumerate(report["measured"].get("speed_factors_by_batch", [])):
            cells = ", ".join(
                " ".join(f"{f:.3f} at {b}" for b, f in sorted(factors.items(), key=lambda kv: int(kv[0])))
                for factors in per_rank
            )
            print(f"  repeat {repeat}: speed factor per rank and batch {cells}")
        for row in compute_alone(report, args.skip):
            medians = " ".join(f"{m:.0f}" for m in row.medians_ms)
            cvs = " ".join(f"{c * 100:.1f}" for c in row.cv)
            print(
                f"  repeat {row.repeat}: forward + backward per rank {medians} ms (CV {cvs} %); "
                f"slowest median {row.slowest_median_ms:.0f}, slowest per iteration {row.slowest_each_ms:.0f}, "
                f"iteration {row.iteration_ms:.0f} ms"
            )
        if args.config == "plan" and traced.exists():
            _print_overlap_paid(args, report, traced)


def _print_overlap_paid(args: argparse.Namespace, report: dict, traced: Path) -> None:
    spec = args.out / "measured" / "cluster.yaml"
    cluster = load_cluster(spec) if spec.exists() else None
    per_mb = cluster.worker_overlap_ms_per_mb() if cluster is not None else ()
    per_task = cluster.worker_overlap_ms_per_task() if cluster is not None else ()
    print("overlap paid in the plan's run (its backward over the compute alone's, first repeat):")
    for rank, (extra, tasks, mib) in overlap_paid(report, Trace.load(traced), args.skip).items():
        mb = per_mb[rank] if rank < len(per_mb) else None
        task = per_task[rank] if rank < len(per_task) else None
        parts = [f"{mb:.1f} ms/MiB x {mib:.1f}" if mb is not None else "per MiB: the simulator's cpu_ms_per_mb"]
        parts.append(f"{task:.1f} ms x {tasks:.0f} task(s)" if task is not None else "per task: its cpu_per_task_ms")
        charged = (mb or 0.0) * mib + (task or 0.0) * tasks
        print(
            f"  rank {rank}: backward {extra:+.0f} ms beside {tasks:.0f} task(s) moving {mib:.1f} MiB; "
            f"calibrated {' + '.join(parts)} = {charged:.0f} ms"
        )


def _print_traces(args: argparse.Namespace, report: dict, traced: Path) -> None:
    sizes = report["batch_sizes"][args.config]
    measured = breakdown(Trace.load(traced), args.skip)
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


if __name__ == "__main__":
    main()
