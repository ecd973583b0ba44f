"""Pictures: a timeline of a simulated (or measured) Trace, and a bar chart comparing policies.

matplotlib runs on the Agg backend (files only, no display needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from commsched.trace import COMM_KINDS, Trace

COLOURS: dict[str, str] = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "update": "#55A868",
    "wait": "#C8C8C8",
    "all_reduce": "#8172B3",
    "reduce_scatter": "#C44E52",
    "all_gather": "#2A9D8F",
    "push": "#937860",
    "pull": "#DA8BC3",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Greedy lane per interval so overlapping ones are drawn one above the other."""
    ends: list[float] = []
    out = []
    for start, end in intervals:
        for lane, lane_end in enumerate(ends):
            if lane_end <= start + 1e-12:
                ends[lane] = end
                out.append(lane)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out


def plot_timeline(
    trace: Trace, path: str | Path, iterations: Sequence[int] | None = None, title: str | None = None
) -> None:
    """Write a PNG: per worker in the trace, a compute row and a communication row, coloured by kind.

    ``iterations``: which iterations to show (default: the last two complete
    steady-state ones, read from ``trace.meta["iteration_starts_s"]`` when
    present). Communication rows split into lanes where collectives overlap.
    """
    plt = _pyplot()
    starts = trace.meta.get("iteration_starts_s")
    if iterations is None:
        if starts and len(starts) >= 4:
            last = len(starts) - 2  # the final entry starts the trailing forward
            iterations = [last - 1, last]
        else:
            iterations = sorted({e.iteration for e in trace.events})[-2:]
    if starts and len(starts) > max(iterations) + 1:
        t0, t1 = starts[min(iterations)], starts[max(iterations) + 1]
    else:
        chosen = [e for e in trace.events if e.iteration in iterations and e.kind not in COMM_KINDS]
        t0 = min(e.start_s for e in chosen)
        t1 = max(e.end_s for e in chosen)
    workers = sorted({e.worker for e in trace.events})
    rows: list[tuple[str, list[Any]]] = []
    for w in workers:
        mine = [e for e in trace.events if e.worker == w and e.end_s > t0 and e.start_s < t1]
        rows.append((f"worker {w}\ncompute", [e for e in mine if e.kind not in COMM_KINDS]))
        rows.append((f"worker {w}\ncomm", sorted((e for e in mine if e.kind in COMM_KINDS), key=lambda e: e.start_s)))
    fig, ax = plt.subplots(figsize=(12, 1.1 + 0.9 * len(rows)))
    y = 0.0
    ticks, labels = [], []
    for label, events in rows:
        comm = label.endswith("comm")
        lanes = _lanes([(e.start_s, e.end_s) for e in events]) if comm else [0] * len(events)
        n = max(lanes, default=0) + 1
        height = 0.8 / n
        for e, lane in zip(events, lanes, strict=True):
            ax.broken_barh(
                [((e.start_s - t0) * 1e3, max(e.duration_s * 1e3, 1e-3))],
                (y - 0.4 + lane * height, height * 0.92),
                facecolors=COLOURS.get(e.kind, "#999999"),
                edgecolor="white",
                linewidth=0.4 if comm else 0.0,
            )
        ticks.append(y)
        labels.append(label)
        y -= 1.0
    for s in starts or []:
        if t0 <= s <= t1:
            ax.axvline((s - t0) * 1e3, color="black", linewidth=0.6, linestyle=":")
    ax.set_yticks(ticks, labels)
    ax.set_xlim(0, (t1 - t0) * 1e3)
    ax.set_xlabel("time (ms)")
    kinds = sorted({e.kind for _, events in rows for e in events}, key=list(COLOURS).index)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS.get(k, "#999999")) for k in kinds]
    meta = trace.meta
    ax.set_title(title or f"{meta.get('policy', '')} · {meta.get('model', '')} · {meta.get('cluster', '')}")
    fig.legend(handles, kinds, loc="lower center", ncol=len(kinds), frameon=False)
    fig.tight_layout(rect=(0, 0.1 if len(rows) <= 2 else 0.05, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_bars(
    rows: Sequence[tuple[str, float]], path: str | Path, title: str = "", ideal_ms: float | None = None
) -> None:
    """Write a PNG bar chart of iteration time (ms) per policy, with the ideal bound as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(rows), 4))
    names = [name for name, _ in rows]
    values = [value for _, value in rows]
    bars = ax.bar(names, values, color="#4C72B0")
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:.0f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=8)
    if ideal_ms is not None:
        ax.axhline(ideal_ms, color="#C44E52", linestyle="--", linewidth=1, label=f"ideal {ideal_ms:.0f} ms")
        ax.legend()
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
