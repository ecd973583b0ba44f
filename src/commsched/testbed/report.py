"""Tables and the bar chart of a ``commsched bench`` report (the dict :func:`run_bench` returns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from commsched.testbed.bench import REFERENCES


def _ms(s: dict[str, Any]) -> str:
    return f"{s['median_ms']:.0f}"


def _spread(s: dict[str, Any]) -> str:
    return f"{s['min_ms']:.0f}–{s['max_ms']:.0f}"


def session_table(report: dict[str, Any], session: dict[str, Any]) -> Table:
    """Policies first (as run), then the references and the ideal-overlap bound."""
    meta = report["meta"]
    cfg = meta["config"]
    title = f"{cfg['model']}, {cfg['workers']} workers × batch {cfg['batch']}, links {session['label']}"
    check = session.get("link_check")
    if check:
        title += f" (measured {check['throughput_mbit_s']:.0f} Mbit/s, RTT {check['rtt_ms']:.2f} ms)"
    table = Table(
        title=title,
        title_justify="left",
        caption="iter ms: median over repeats (min–max over repeats) of the median slowest-rank step; "
        "speed-up and max |Δp| (largest parameter difference after the last step) are against torch_ddp",
        caption_justify="left",
    )
    for col, justify in (
        ("policy", "left"),
        ("iter ms", "right"),
        ("min–max", "right"),
        ("samples/s", "right"),
        ("speed-up", "right"),
        ("÷ ideal", "right"),
        ("max |Δp|", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    summary = session["summary"]
    for name in cfg["policies"]:
        s = summary.get(name)
        if s is None:
            continue
        speed = s.get("speedup_vs_torch_ddp")
        vs_ideal = s.get("vs_ideal")
        diff = s.get("max_param_diff")
        table.add_row(
            name,
            _ms(s),
            _spread(s),
            f"{s['samples_per_s']:.1f}",
            f"{speed:.2f}×" if speed is not None else "—",
            f"{vs_ideal:.2f}" if vs_ideal is not None else "—",
            "reference" if name == "torch_ddp" else (f"{diff:.1e}" if diff is not None else "—"),
        )
    refs = []
    alone = report.get("compute_alone")
    if alone is not None:
        refs.append((REFERENCES["compute_alone"], alone["summary"]["compute_alone"]))
    for key in ("compute", "allreduce"):
        if key in summary:
            refs.append((REFERENCES[key], summary[key]))
    for i, (label, s) in enumerate(refs):
        table.add_row(label, _ms(s), _spread(s), "", "", "", "", style="dim", end_section=i == len(refs) - 1)
    if "ideal_overlap_ms" in session:
        table.add_row("ideal ≈ max(N at once, all-reduce)", f"{session['ideal_overlap_ms']:.0f}", style="dim")
    return table


def markdown_table(report: dict[str, Any], session: dict[str, Any]) -> str:
    """The same table as Markdown (for BENCHMARKS.md)."""
    cfg = report["meta"]["config"]
    summary = session["summary"]
    lines = [
        "| policy | iteration ms (median) | min–max over repeats | samples/s | vs torch_ddp | ÷ ideal "
        "| max abs Δparam vs torch_ddp |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in cfg["policies"]:
        s = summary.get(name)
        if s is None:
            continue
        speed, vs_ideal, diff = s.get("speedup_vs_torch_ddp"), s.get("vs_ideal"), s.get("max_param_diff")
        lines.append(
            f"| {name} | {_ms(s)} | {_spread(s)} | {s['samples_per_s']:.1f} "
            f"| {f'{speed:.2f}×' if speed is not None else '—'} | {f'{vs_ideal:.2f}' if vs_ideal is not None else '—'} "
            f"| {'reference' if name == 'torch_ddp' else (f'{diff:.1e}' if diff is not None else '—')} |"
        )
    alone = report.get("compute_alone")
    if alone is not None:
        s = alone["summary"]["compute_alone"]
        lines.append(f"| *{REFERENCES['compute_alone']}* | {_ms(s)} | {_spread(s)} | | | | |")
    for key in ("compute", "allreduce"):
        if key in summary:
            s = summary[key]
            lines.append(f"| *{REFERENCES[key]}* | {_ms(s)} | {_spread(s)} | | | | |")
    if "ideal_overlap_ms" in session:
        lines.append(f"| *ideal overlap ≈ max(N at once, all-reduce)* | {session['ideal_overlap_ms']:.0f} | | | | | |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Grouped bars: one group per link shaping, one bar per policy (error bar: min–max over repeats).

    The references are hatched bars after the policies; the ideal-overlap bound is a dashed line per group.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = report["meta"]["config"]
    sessions = report["sessions"]
    names = [p for p in cfg["policies"]] + ["compute", "allreduce"]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * len(sessions) + 3), 4.5))
    colors = plt.get_cmap("tab10")
    for j, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for i, session in enumerate(sessions):
            s = session["summary"].get(name)
            if s is None:
                continue
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            ys.append(s["median_ms"])
            lo.append(s["median_ms"] - s["min_ms"])
            hi.append(s["max_ms"] - s["median_ms"])
        if not xs:
            continue
        is_ref = name in REFERENCES
        ax.bar(
            xs,
            ys,
            width,
            yerr=[lo, hi],
            capsize=2,
            label=REFERENCES.get(name, name),
            color="white" if is_ref else colors(j % 10),
            edgecolor="gray" if is_ref else colors(j % 10),
            hatch="//" if is_ref else None,
        )
    bounds = [(i, s["ideal_overlap_ms"]) for i, s in enumerate(sessions) if "ideal_overlap_ms" in s]
    if bounds:
        ax.hlines(
            [b for _, b in bounds],
            [i - 0.42 for i, _ in bounds],
            [i + 0.42 for i, _ in bounds],
            colors="black",
            linestyles="dashed",
            label="ideal overlap ≈ max(compute N at once, all-reduce)",
        )
    ax.set_xticks(range(len(sessions)), [s["label"] for s in sessions])
    ax.set_xlabel("per-worker link (both directions)")
    ax.set_ylabel("iteration time, ms (median; bars: min–max over repeats)")
    cpus = report["meta"]["machine"]["cpus"]
    ax.set_title(f"{cfg['model']}, {cfg['workers']} workers × batch {cfg['batch']}, gloo, {cpus} CPUs")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
