"""Tables of a ``commsched bench --plan`` report (the dict :func:`commsched.bench.hetero.run_hetero_bench` returns)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from commsched.bench.hetero import LABELS
from commsched.bench.hetero_worker import REFERENCES

#: The targets the setup of docs/planning.md is measured against.
TARGET_VS_EVEN = 1.6
TARGET_VS_PROPORTIONAL = 1.05
TARGET_ERROR_PCT = 15.0

COLUMNS = (
    "configuration",
    "per-rank batch",
    "predicted ms",
    "measured ms",
    "min–max",
    "error",
    "predicted at run speed",
    "error at run speed",
    "samples/s",
    "vs even DP",
    "vs proportional DP",
    "max |Δp| vs even DP",
)


#: The columns of the prediction at the runs' speed, left out of reports from before it was made.
AT_RUN_COLUMNS = ("predicted at run speed", "error at run speed")


def columns(report: dict[str, Any]) -> tuple[str, ...]:
    """The table's columns: :data:`COLUMNS`, less :data:`AT_RUN_COLUMNS` where no row has that prediction."""
    if any("predicted_at_run_ms" in row for row in report["summary"].values()):
        return COLUMNS
    return tuple(c for c in COLUMNS if c not in AT_RUN_COLUMNS)


def rows(report: dict[str, Any]) -> list[list[str]]:
    keep = [i for i, c in enumerate(COLUMNS) if c in columns(report)]
    out = []
    for name, label in LABELS.items():
        s = report["summary"].get(name)
        if s is None:
            continue
        sizes = report["batch_sizes"][name]
        cells = [
            label,
            " ".join(str(b) for b in sizes),
            f"{s['predicted_ms']:.0f}" if "predicted_ms" in s else "—",
            f"{s['median_ms']:.0f}",
            f"{s['min_ms']:.0f}–{s['max_ms']:.0f}",
            f"{s['error_pct']:+.1f} %" if "error_pct" in s else "—",
            f"{s['predicted_at_run_ms']:.0f}" if "predicted_at_run_ms" in s else "—",
            f"{s['error_at_run_pct']:+.1f} %" if "error_at_run_pct" in s else "—",
            f"{sum(sizes) / s['median_ms'] * 1e3:.1f}",
            f"{s['speedup_vs_even_ddp']:.2f}×" if "speedup_vs_even_ddp" in s else "",
            f"{s['speedup_vs_proportional_dp']:.2f}×" if "speedup_vs_proportional_dp" in s else "",
            f"{s['max_param_diff']:.1e}" if "max_param_diff" in s and name != "even_ddp" else "",
        ]
        out.append([cells[i] for i in keep])
    return out


def targets(report: dict[str, Any]) -> list[tuple[str, bool]]:
    """Each target of the setup (plan vs even DP, vs proportional DP, prediction error) and whether it was met.

    The prediction's error is given twice where the report has both: at the runs' compute speed (the
    simulation with every rank's compute rescaled by the reference timed before each repeat,
    :mod:`commsched.bench.drift`) and at the calibration's (what the planner saw).
    """
    s = report["summary"]
    plan = s.get("plan", {})
    out = []
    if "speedup_vs_even_ddp" in plan:
        v = plan["speedup_vs_even_ddp"]
        out.append((f"plan {v:.2f}× even DP (target ≥ {TARGET_VS_EVEN}×)", v >= TARGET_VS_EVEN))
    if "speedup_vs_proportional_dp" in plan:
        v = plan["speedup_vs_proportional_dp"]
        out.append(
            (f"plan {v:.2f}× speed-proportional DP (target ≥ {TARGET_VS_PROPORTIONAL}×)", v >= TARGET_VS_PROPORTIONAL)
        )
    for key, speed in (("error_at_run_pct", "at the runs' compute speed"), ("error_pct", "at the calibration's")):
        errors = {name: row[key] for name, row in s.items() if key in row and name not in REFERENCES}
        if errors:
            worst = max(errors, key=lambda k: abs(errors[k]))
            out.append(
                (
                    f"largest prediction error {speed} {errors[worst]:+.1f} % ({LABELS.get(worst, worst)}; "
                    f"target within ±{TARGET_ERROR_PCT:g} %)",
                    abs(errors[worst]) <= TARGET_ERROR_PCT,
                )
            )
    return out


def spec_rows(report: dict[str, Any]) -> list[list[str]]:
    """Per worker: its CPU share and link as set, and as measured (what the planner saw).

    The last cells, the overlap costs in ms per MiB and per task and the share of its rate a collective keeps
    beside compute, are "—" in reports from before they were measured (and the last where the rank computed
    too briefly to tell).
    """
    cfg, measured = report["meta"]["config"], report["measured"]
    overlaps = measured.get("overlap_ms_per_mb") or [None] * len(cfg["cpu"])
    per_task = measured.get("overlap_ms_per_task") or [None] * len(cfg["cpu"])
    rates = measured.get("overlap_comm_rate") or [None] * len(cfg["cpu"])
    out = []
    for r, (cpu, link, rate) in enumerate(zip(cfg["cpu"], cfg["links"], measured["links"], strict=True)):
        cores = "any" if cpu["cpus"] is None else ",".join(map(str, cpu["cpus"]))
        quota = "100 %" if cpu["quota"] is None else f"{cpu['quota'] * 100:g} %"
        shaped = "unshaped" if link["rate_bps"] is None else f"{link['rate_bps'] / 1e6:g} Mbit/s"
        out.append(
            [
                f"w{r}",
                f"core {cores} @ {quota}",
                shaped,
                f"{rate['throughput_mbit_s']:.0f} Mbit/s",
                f"{measured['rank_compute_ms'][r]:.1f}",
                f"{measured['speeds'][r]:.3f}",
                "—" if overlaps[r] is None else f"{overlaps[r]:.1f}",
                "—" if per_task[r] is None else f"{per_task[r]:.1f}",
                "—" if rates[r] is None else f"{rates[r]:.2f}",
            ]
        )
    return out


def tables(report: dict[str, Any]) -> list[Table]:
    """The measured spec, then the configurations side by side (console)."""
    m = report["measured"]
    spec = Table(
        title=f"testbed as measured (profile batch {m['profile_batch']}; gloo all-reduce {m['allreduce_mbit_s']:.0f} "
        f"Mbit/s, α {m['alpha_us']:.0f} µs; update {m['update_ms']:.1f} ms)",
        title_justify="left",
    )
    for col in (
        "worker",
        "CPU (set)",
        "link (set)",
        "link (measured)",
        "fwd+bwd ms",
        "speed",
        "overlap ms/MiB",
        "ms/task",
        "comm rate beside compute",
    ):
        spec.add_column(col, justify="left" if col in ("worker", "CPU (set)") else "right")
    for cells in spec_rows(report):
        spec.add_row(*cells)
    cfg = report["meta"]["config"]
    main = Table(
        title=f"{cfg['model']}, global batch {report['global_batch']}, {cfg['repeats']} repeats × {cfg['iters']} "
        f"timed iterations; plan: {report['plan'].get('policy', '?')} ({report['plan']['source']})",
        title_justify="left",
        caption="measured: median over repeats of the slowest rank's mean iteration time; predicted: the simulator "
        "on the measured spec; at run speed: the same with each rank's compute rescaled to its reference timed "
        "before each repeat (median over repeats); speed-ups paired by repeat",
        caption_justify="left",
    )
    for i, col in enumerate(columns(report)):
        main.add_column(col, justify="left" if i < 2 else "right")
    for cells in rows(report):
        main.add_row(*cells)
    return [spec, main]


def markdown(report: dict[str, Any]) -> str:
    header = [c.replace("|", "\\|") for c in columns(report)]
    lines = [f"| {' | '.join(header)} |", "|---" * len(header) + "|"]
    lines += [f"| {' | '.join(cells)} |" for cells in rows(report)]
    return "\n".join(lines)
