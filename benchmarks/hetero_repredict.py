"""A saved ``commsched bench --plan`` run's predictions, made again from its calibration with today's model.

    python benchmarks/hetero_repredict.py DIR [DIR ...]

DIR holds what a run wrote (``hetero.json``, ``plan.json``, ``calibrate/``).
The measured spec is rebuilt from the saved calibration
(:func:`commsched.bench.hetero_spec.measured_spec`), the saved plan is bound
to that spec's workload (its split and policy as they were chosen), and every
configuration is simulated again; beside it, the prediction the run itself
made and the measured median, so a change to the model can be judged on runs
already made. Runs that timed each rank's reference before every repeat
(``speed_factors``) are also predicted again at the runs' speed
(:mod:`commsched.bench.drift`; per batch where the run timed each rank's
batch in the plan too, ``speed_factors_by_batch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from commsched.bench.hetero import batch_sizes, predictions, predictions_at_run_speed
from commsched.bench.hetero_spec import measured_spec
from commsched.schedule import CommPlan
from commsched.testbed.linkrate import LinkRate


def repredict(run: Path) -> dict[str, dict[str, float]]:
    """Per configuration: ``measured``, ``saved`` (the run's prediction) and ``now`` ms."""
    report = json.loads((run / "hetero.json").read_text())
    n = len(report["measured"]["links"])
    ranks = [json.loads((run / "calibrate" / f"rank{r}.json").read_text()) for r in range(n)]
    links = [LinkRate(**link) for link in report["measured"]["links"]]
    memory = report["meta"]["config"]["memory_gib"] / n
    spec = measured_spec(ranks, links, memory_gib=memory, name="testbed (measured)")
    plan = dataclasses.replace(CommPlan.load(run / "plan.json"), workload=spec.workload)
    sizes = batch_sizes(spec, plan, report["global_batch"])
    now, _ = predictions(spec, plan, sizes, trace=False)
    by_batch = report["measured"].get("speed_factors_by_batch")
    factors = (
        [[{int(b): f for b, f in per.items()} for per in row] for row in by_batch]
        if by_batch is not None
        else report["measured"].get("speed_factors", [])
    )
    at_run = predictions_at_run_speed(spec, plan, sizes, factors)
    out = {}
    for name, row in report["summary"].items():
        if name in now:
            out[name] = {"measured": row["median_ms"], "saved": row["predicted_ms"], "now": now[name]}
            if name in at_run:
                out[name]["now_at_run"] = at_run[name]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="directories of saved `commsched bench --plan` runs")
    args = parser.parse_args()
    rows = {run: repredict(run) for run in args.runs}
    at_run = any("now_at_run" in r for per in rows.values() for r in per.values())
    extra = " at run speed now | error |" if at_run else ""
    print("| run | configuration | measured ms | predicted then | error | predicted now | error |" + extra)
    print("|---|---|---|---|---|---|---|" + ("---|---|" if at_run else ""))
    for run, per in rows.items():
        for name, r in per.items():
            m = r["measured"]
            cells = (
                f"| {run.name} | {name} | {m:.0f} | {r['saved']:.0f} | {(r['saved'] - m) / m * 100:+.1f} % "
                f"| {r['now']:.0f} | {(r['now'] - m) / m * 100:+.1f} % |"
            )
            if at_run:
                v = r.get("now_at_run")
                cells += " — | — |" if v is None else f" {v:.0f} | {(v - m) / m * 100:+.1f} % |"
            print(cells)


if __name__ == "__main__":
    main()
