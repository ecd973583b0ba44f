"""The bar chart of a ``commsched bench`` report: iteration times and speed-ups per link shaping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from commsched.bench.baselines import TORCH_DDP, YARDSTICK
from commsched.bench.report import shaping
from commsched.bench.summary import REFERENCES

#: Series of the plot that are a session's baseline, whichever DDP configuration it is there.
_BASELINE_SERIES = {"default DDP": "default_ddp", "best DDP": "best_ddp"}


def plot(report: dict[str, Any], path: Path) -> None:
    """Two panels, one group of bars per link shaping.

    Top: iteration time per policy, default DDP and best DDP where measured
    (median, error bar min–max over repeats), the references hatched, the
    ideal-overlap bound dashed. Bottom: speed-up over best DDP (median of the
    per-repeat ratios, error bar min–max), or over ``torch_ddp`` for sessions
    measured without the DDP grid.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = report["meta"]["config"]
    sessions = report["sessions"]
    baselines = [label for label, key in _BASELINE_SERIES.items() if any(key in s for s in sessions)]
    policies = [*cfg["policies"], *baselines, YARDSTICK]
    names = [*policies, "compute", "allreduce"]
    colors = plt.get_cmap("tab10" if len(policies) <= 10 else "tab20")
    color = {name: colors(j % colors.N) for j, name in enumerate(policies)}
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(8.0, 2.6 * len(sessions) + 4), 7.5), height_ratios=(3, 2), sharex=True
    )

    def summary_of(session: dict[str, Any], name: str) -> dict[str, Any] | None:
        if name in _BASELINE_SERIES:
            chosen = session.get(_BASELINE_SERIES[name])
            return None if chosen is None else session["summary"].get(chosen)
        result: dict[str, Any] | None = session["summary"].get(name)
        return result

    def bars(ax: Any, names: list[str], value: str, lo_key: str, hi_key: str) -> None:
        width = 0.84 / len(names)
        for j, name in enumerate(names):
            xs, ys, lo, hi = [], [], [], []
            for i, session in enumerate(sessions):
                s = summary_of(session, name)
                if s is None or value not in s:
                    continue
                xs.append(i + (j - (len(names) - 1) / 2) * width)
                ys.append(s[value])
                lo.append(s[value] - s.get(lo_key, s[value]))
                hi.append(s.get(hi_key, s[value]) - s[value])
            if not xs:
                continue
            is_ref = name in REFERENCES and name != YARDSTICK
            ax.bar(
                xs,
                ys,
                width,
                yerr=[lo, hi],
                capsize=2,
                label=REFERENCES.get(name, name),
                color="white" if is_ref else color[name],
                edgecolor="gray" if is_ref else color[name],
                hatch="//" if is_ref else ("xx" if name == YARDSTICK else None),
            )
            if name == "best DDP" and value == "median_ms":  # which configuration won, session by session
                for x, session in zip(xs, [s for s in sessions if "best_ddp" in s], strict=True):
                    ax.annotate(
                        session["best_ddp"],
                        (x, 0),
                        xytext=(0, 4),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        rotation=90,
                        fontsize=7,
                        color="white",
                    )

    bars(top, names, "median_ms", "min_ms", "max_ms")
    bounds = [(i, s["ideal_overlap_ms"]) for i, s in enumerate(sessions) if "ideal_overlap_ms" in s]
    if bounds:
        top.hlines(
            [b for _, b in bounds],
            [i - 0.44 for i, _ in bounds],
            [i + 0.44 for i, _ in bounds],
            colors="black",
            linestyles="dashed",
            label="ideal ≈ max(compute N in lock-step, all-reduce)",
        )
    top.set_ylabel("iteration time, ms")
    cpus = report["meta"]["machine"]["cpus"]
    top.set_title(
        f"{cfg['model']}, {cfg['workers']} workers × batch {cfg['batch']} on {cpus} CPUs, gloo; "
        "median over repeats, bars min–max"
    )
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if "best DDP" in baselines:
        key, label = "speedup_vs_best_ddp", "speed-up over best DDP"
        compared = [p for p in policies if p not in ("best DDP", YARDSTICK)]
        lo_key, hi_key = f"{key}_min", f"{key}_max"
    else:
        key, label = "speedup_vs_torch_ddp", "speed-up over torch_ddp"
        compared = [p for p in policies if p != TORCH_DDP]
        lo_key, hi_key = "speedup_min", "speedup_max"
    bars(bottom, compared, key, lo_key, hi_key)
    bottom.axhline(1.0, color="black", linewidth=0.8)
    lows = [s.get(lo_key, 1.0) for session in sessions for s in session["summary"].values()]
    bottom.set_ylim(bottom=min(0.5, *lows) - 0.05)
    bottom.set_ylabel(label)
    bottom.set_xticks(range(len(sessions)), [shaping(s) for s in sessions])
    bottom.set_xlabel("per-worker link (both directions)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
