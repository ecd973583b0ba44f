"""Tables of a ``commsched bench`` report (the dict :func:`run_bench` returns); the chart is :mod:`.plot`."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from commsched.bench.baselines import DDP_GRID, TORCH_DDP, YARDSTICK
from commsched.bench.summary import REFERENCES
from commsched.schedule import AUTO
from commsched.testbed import LinkShape

#: The console's tables add p50 / p90 of the step times after min–max (bench.json has p99 too).
TAIL_COLUMN = "p50 / p90 ms"
TAIL_CAPTION = "; p50 / p90 ms: percentiles over every timed step of every repeat of the slowest rank's step time"
#: Sessions measured before the DDP grid (or with ``--no-ddp-grid``): speed-up against torch_ddp.
COLUMNS = ("policy", "iter ms", "min–max", "samples/s", "speed-up", "÷ ideal", "max |Δp|")
CAPTION = (
    "iter ms: median over repeats (min–max: over repeats) of the slowest rank's mean iteration time; "
    "speed-up (median over repeats of torch_ddp / policy in the same repeat) and max |Δp| (largest parameter "
    "difference after the last step) are against torch_ddp; ÷ ideal: iteration time over max(compute N in "
    "lock-step, all-reduce alone), same repeat"
)
#: Sessions with the DDP grid: speed-up against default DDP and best DDP.
GRID_COLUMNS = ("policy", "iter ms", "min–max", "samples/s", "vs default DDP", "vs best DDP", "÷ ideal", "max |Δp|")
GRID_CAPTION = (
    "iter ms: median over repeats (min–max: over repeats) of the slowest rank's mean iteration time; "
    "vs default DDP (DistributedDataParallel(model), PyTorch's defaults) and vs best DDP (the fastest of "
    "bucket_cap_mb 1, 4, 25 × find_unused_parameters False, True, by median): median over repeats of the "
    "baseline / policy in the same repeat (min–max over repeats); max |Δp|: largest parameter difference from "
    "torch_ddp after the last step; ÷ ideal: iteration time over max(compute N in lock-step, all-reduce alone)"
)
GRID_TABLE_COLUMNS = ("DDP", "bucket_cap_mb", "find_unused_parameters", "iter ms", "min–max", "vs default DDP")


def _speed_cell(s: dict[str, Any], baseline: str = TORCH_DDP) -> str | None:
    """``1.23× (1.10–1.31)``: the paired speed-up against ``baseline`` (torch_ddp, default_ddp, best_ddp)."""
    value = s.get(f"speedup_vs_{baseline}")
    if value is None:
        return None
    prefix = "speedup" if baseline == TORCH_DDP else f"speedup_vs_{baseline}"
    cell = f"{value:.2f}×"
    lo, hi = s.get(f"{prefix}_min"), s.get(f"{prefix}_max")
    if lo is not None and lo != hi:
        cell += f" ({lo:.2f}–{hi:.2f})"
    return cell


def _tail_cell(s: dict[str, Any]) -> str:
    """``212 / 260``: p50 / p90 of the step times (summaries made before percentiles were kept: ``—``)."""
    if "p50_ms" not in s or s.get("steps", 0) == 0:
        return "—"
    return f"{s['p50_ms']:.0f} / {s['p90_ms']:.0f}"


def has_grid(session: dict[str, Any]) -> bool:
    """Whether the session measured default DDP (and so the DDP grid): its tables compare against DDP's defaults."""
    return "default_ddp" in session


def columns(session: dict[str, Any], tails: bool = False) -> tuple[str, ...]:
    """The table's columns; ``tails``: with p50 / p90 after min–max (the console's table)."""
    base = GRID_COLUMNS if has_grid(session) else COLUMNS
    return (*base[:3], TAIL_COLUMN, *base[3:]) if tails else base


def _diff_cell(name: str, diff: float | None) -> str:
    if name == "torch_ddp":
        return "reference" if diff is None else f"ref. (run to run {diff:.1e})"
    return f"{diff:.1e}" if diff is not None else "—"


def rows(report: dict[str, Any], session: dict[str, Any], tails: bool = False) -> list[tuple[list[str], bool]]:
    """Table rows (cells, is_reference) under :func:`columns`.

    The policies as run; with the DDP grid, ``default DDP`` and ``best DDP``
    (naming the winning configuration); then the references and the ideal bound.
    """
    summary = session["summary"]
    baselines = ("default_ddp", "best_ddp") if has_grid(session) else (TORCH_DDP,)
    out: list[tuple[list[str], bool]] = []

    def row(name: str, label: str, s: dict[str, Any], reference: bool) -> None:
        vs_ideal = s.get("vs_ideal")
        measured = not reference or name == YARDSTICK
        speeds = [_speed_cell(s, baseline) or ("" if reference else "—") for baseline in baselines]
        cells = [
            label,
            f"{s['median_ms']:.0f}",
            f"{s['min_ms']:.0f}–{s['max_ms']:.0f}",
            *([_tail_cell(s)] if tails else []),
            f"{s['samples_per_s']:.1f}" if measured else "",
            *speeds,
            f"{vs_ideal:.2f}" if vs_ideal is not None else ("" if reference else "—"),
            _diff_cell(name, s.get("max_param_diff")) if measured else "",
        ]
        out.append((cells, reference))

    for name in report["meta"]["config"]["policies"]:
        if name in summary:
            row(name, name, summary[name], False)
    for key, label in (("default_ddp", "default DDP"), ("best_ddp", "best DDP")):
        if key in session:
            row(session[key], f"{label}: {session[key]}", summary[session[key]], False)
    if YARDSTICK in summary:
        row(YARDSTICK, REFERENCES[YARDSTICK], summary[YARDSTICK], True)
    alone = report.get("compute_alone")
    if alone is not None:
        row("compute_alone", REFERENCES["compute_alone"], alone["summary"]["compute_alone"], True)
    for key in ("compute", "allreduce"):
        if key in summary:
            row(key, REFERENCES[key], summary[key], True)
    if "ideal_overlap_ms" in session:
        blank = [""] * (len(columns(session, tails)) - 2)
        out.append((["ideal ≈ max(N in lock-step, all-reduce)", f"{session['ideal_overlap_ms']:.0f}", *blank], True))
    return out


def grid_rows(session: dict[str, Any]) -> list[list[str]]:
    """One row per DDP configuration measured in the session, the default and the best marked; [] without a grid."""
    summary = session["summary"]
    if not has_grid(session):
        return []
    out = []
    for config in DDP_GRID:
        s = summary.get(config.name)
        if s is None:
            continue
        marks = [m for key, m in (("default_ddp", "default"), ("best_ddp", "best")) if session.get(key) == config.name]
        out.append(
            [
                config.name + (f" ({', '.join(marks)})" if marks else ""),
                str(config.bucket_cap_mb),
                str(config.find_unused_parameters),
                f"{s['median_ms']:.0f}",
                f"{s['min_ms']:.0f}–{s['max_ms']:.0f}",
                _speed_cell(s, "default_ddp") or "—",
            ]
        )
    return out


def grid_markdown(session: dict[str, Any]) -> str:
    """The DDP grid of a session as Markdown; "" when the session has none."""
    body = grid_rows(session)
    if not body:
        return ""
    lines = [f"| {' | '.join(GRID_TABLE_COLUMNS)} |", "|---" * len(GRID_TABLE_COLUMNS) + "|"]
    return "\n".join(lines + [f"| {' | '.join(cells)} |" for cells in body])


def grid_table(report: dict[str, Any], session: dict[str, Any]) -> Table | None:
    """The DDP grid of a session for the console; None when the session has none."""
    body = grid_rows(session)
    if not body:
        return None
    table = Table(
        title=f"PyTorch DDP, links {shaping(session)}: which configuration is best DDP",
        title_justify="left",
        caption="default: DistributedDataParallel(model); best: lowest median iteration time; torch_ddp is "
        "(25, True), the reference of max |Δp|",
        caption_justify="left",
    )
    for i, col in enumerate(GRID_TABLE_COLUMNS):
        table.add_column(col, justify="left" if i == 0 else "right")
    for cells in body:
        table.add_row(*cells)
    return table


def phase_table(report: dict[str, Any], session: dict[str, Any]) -> str:
    """Markdown: where a step's time goes, per policy (median over repeats of the ranks' mean per phase)."""
    summary = session["summary"]
    policies = report["meta"]["config"]["policies"]
    names = [*policies, *(c.name for c in DDP_GRID if c.name not in policies), "compute"]
    lines = ["| policy | forward ms | backward ms | step ms | iteration ms |", "|---|---|---|---|---|"]
    for name in names:
        s = summary.get(name)
        if s is None or "phases_ms" not in s:
            continue
        p = s["phases_ms"]
        label = f"*{REFERENCES[name]}*" if name in REFERENCES else name
        lines.append(f"| {label} | {p['forward']:.0f} | {p['backward']:.0f} | {p['step']:.0f} | {s['median_ms']:.0f} |")
    return "\n".join(lines)


def shaping(session: dict[str, Any]) -> str:
    """A session's links for people: ``unshaped``, ``1gbit``, ``300mbit+2ms`` (:attr:`LinkShape.description`)."""
    label: str = session["label"]
    return "unshaped" if label == LinkShape().label else label


def _title(report: dict[str, Any], session: dict[str, Any]) -> str:
    cfg = report["meta"]["config"]
    title = f"{cfg['model']}, {cfg['workers']} workers × batch {cfg['batch']}, links {shaping(session)}"
    check = session.get("link_check")
    if check:
        title += f" (measured {check['throughput_mbit_s']:.0f} Mbit/s, RTT {check['rtt_ms']:.2f} ms)"
    return title


def session_table(report: dict[str, Any], session: dict[str, Any]) -> Table:
    """The console's table of a session, with p50 / p90 of the step times (Markdown: :func:`markdown_table`)."""
    caption = (GRID_CAPTION if has_grid(session) else CAPTION) + TAIL_CAPTION
    table = Table(title=_title(report, session), title_justify="left", caption=caption, caption_justify="left")
    for i, col in enumerate(columns(session, tails=True)):
        table.add_column(col, justify="left" if i == 0 else "right")
    previous_ref = False
    for cells, reference in rows(report, session, tails=True):
        if reference and not previous_ref:
            table.add_section()
        table.add_row(*cells, style="dim" if reference else None)
        previous_ref = reference
    return table


def _validated(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The sessions with a validation, and every name they predicted, in order."""
    sessions = [s for s in report["sessions"] if "validation" in s]
    names: list[str] = []
    for s in sessions:
        names += [n for n in s["validation"]["rows"] if n not in names]
    return sessions, names


def _validation_cell(session: dict[str, Any], name: str) -> str:
    r = session["validation"]["rows"].get(name)
    if r is None:
        return ""
    if "error" in r:
        return f"not simulated: {r['error']}"
    as_chosen = f" as {r['simulated_as'].split()[0]}" if name == AUTO else ""  # auto: predicted as what it chose
    return f"{r['predicted_ms']:.0f} / {r['measured_ms']:.0f} ({r['error_pct']:+.1f} %){as_chosen}"


def _median_error_cell(session: dict[str, Any]) -> str:
    m = session["validation"]["median_abs_error_pct"]
    return "—" if m is None else f"{m:.1f} %"


def validation_table(report: dict[str, Any]) -> Table:
    """Predicted (simulator, calibrated on the testbed) against measured iteration time, per shaping."""
    sessions, names = _validated(report)
    table = Table(
        title="Simulator validation: predicted / measured iteration ms (error)",
        title_justify="left",
        caption="error = (predicted - measured) / measured; the simulator was calibrated before the policies ran "
        "(α-β probe of the shaped links, per-layer profile with the ranks sharing the CPUs); "
        "references in grey: each checks one input of the model",
        caption_justify="left",
    )
    table.add_column("policy")
    for s in sessions:
        c = s["validation"]["calibration"]
        fit = f"α {c['alpha_us']:.0f} µs, {c['bandwidth_mbit_s']:.0f} Mbit/s"
        table.add_column(f"{shaping(s)}\n({fit})", justify="right")
    for name in names:
        cells = [_validation_cell(s, name) for s in sessions]
        table.add_row(REFERENCES.get(name, name), *cells, style="dim" if name in REFERENCES else None)
    table.add_section()
    table.add_row("median |error| (policies)", *[_median_error_cell(s) for s in sessions])
    return table


def validation_markdown(report: dict[str, Any]) -> str:
    """The validation table as Markdown (for BENCHMARKS.md); references in italics."""
    sessions, names = _validated(report)
    if not sessions:
        return ""
    lines = ["| policy | " + " | ".join(shaping(s) for s in sessions) + " |", "|---" * (len(sessions) + 1) + "|"]
    for name in names:
        label = f"*{REFERENCES[name]}*" if name in REFERENCES else name
        lines.append(f"| {label} | " + " | ".join(_validation_cell(s, name) for s in sessions) + " |")
    lines.append("| median \\|error\\| (policies) | " + " | ".join(_median_error_cell(s) for s in sessions) + " |")
    return "\n".join(lines)


def markdown_table(report: dict[str, Any], session: dict[str, Any], tails: bool = False) -> str:
    """The same table as Markdown (for BENCHMARKS.md); references in italics; ``tails``: with p50 / p90."""
    header = [c.replace("|", "\\|") for c in columns(session, tails)]
    lines = [f"| {' | '.join(header)} |", "|---" * len(header) + "|"]
    for cells, reference in rows(report, session, tails):
        label = f"*{cells[0]}*" if reference else cells[0]
        lines.append(f"| {' | '.join([label, *cells[1:]])} |")
    return "\n".join(lines)
