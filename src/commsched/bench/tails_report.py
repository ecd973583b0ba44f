"""Reading a tails report (:mod:`commsched.bench.tails_run`): the DLCP targets' ratios and the plot of round times.

Every ratio is baseline / method (above 1: the method is faster) of a percentile of the round time in one
scenario; beside each target, the most the method could reach at its floor, and what the loss and the incast
cost the TCP baselines.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from commsched.bench.tails import METHODS

#: (scenario, baseline, method, percentile, target): the DLCP targets, as baseline / method >= target.
TARGETS = (
    ("lossless", "ps1", "dlcp_ps", "p50", 1 / 1.05),
    ("loss", "ps1", "dlcp_ps", "p99", 1.5),
    ("loss", "ps1", "dlcp_ps", "p50", 1.2),
    ("loss", "gloo", "dlcp", "p99", 1.3),
    ("loss", "gloo", "dlcp", "p50", 1.0),
    ("incast", "ps1", "dlcp_ps", "p99", 1.5),
)
#: Further ratios printed for reference, with no target.
REFERENCE_RATIOS = (("lossless", "ps", "dlcp"), ("loss", "ps", "dlcp"), ("lossless", "gloo", "dlcp"))


def ratio(results: dict[str, Any], scenario: str, baseline: str, method: str, stat: str) -> float | None:
    """``baseline``'s ``stat`` (p50, p99) of round time over ``method``'s in one scenario; None if one is missing."""
    methods = results.get(scenario, {}).get("methods", {})
    if baseline not in methods or method not in methods:
        return None
    a, b = methods[baseline]["round"][f"{stat}_ms"], methods[method]["round"][f"{stat}_ms"]
    return float(a / b) if b > 0 else None


def _ceiling(results: dict[str, Any], scenario: str, baseline: str, method: str, stat: str) -> float | None:
    """``baseline``'s ``stat`` over ``method``'s floor (the sleep + :func:`~commsched.bench.tails.wire_floor_ms`):
    the largest ratio ``method`` could reach against that measurement; None where either is missing."""
    methods = results.get(scenario, {}).get("methods", {})
    if baseline not in methods or "floor_ms" not in methods.get(method, {}):
        return None
    return float(methods[baseline]["round"][f"{stat}_ms"] / methods[method]["floor_ms"])


def _cost(results: dict[str, Any], scenario: str, method: str, stat: str) -> float | None:
    """``method``'s ``stat`` of round time in ``scenario`` over its own in the lossless scenario."""
    hit = results.get(scenario, {}).get("methods", {}).get(method)
    calm = results.get("lossless", {}).get("methods", {}).get(method)
    if not hit or not calm or calm["round"][f"{stat}_ms"] <= 0:
        return None
    return float(hit["round"][f"{stat}_ms"] / calm["round"][f"{stat}_ms"])


def ratio_lines(results: dict[str, Any]) -> list[str]:
    """The DLCP targets against what was measured, then the reference ratios, and what the loss and the incast cost
    the TCP baselines (their round time there over their lossless one: at 1 % loss, the most a transport that made
    the loss free could gain on the same schedule)."""
    lines = []
    for scenario, baseline, method, stat, target in TARGETS:
        r = ratio(results, scenario, baseline, method, stat)
        if r is not None:
            verdict = "met" if r >= target else "missed"
            lines.append(f"{scenario:8} {stat} {baseline}/{method}: {r:.2f}x (target >= {target:.2f}x: {verdict})")
    for scenario, baseline, method, stat, target in TARGETS:
        ceiling = _ceiling(results, scenario, baseline, method, stat)
        if ceiling is not None:
            floor = results[scenario]["methods"][method]["floor_ms"]
            verdict = "reachable" if ceiling >= target else "out of reach"
            head = f"{scenario:8} {stat} {baseline}/{method}: at most {ceiling:.2f}x"
            lines.append(f"{head} at {method}'s floor of {floor:.1f} ms a round (target {verdict})")
    for scenario, baseline, method in REFERENCE_RATIOS:
        for stat in ("p50", "p99"):
            r = ratio(results, scenario, baseline, method, stat)
            if r is not None:
                lines.append(f"{scenario:8} {stat} {baseline}/{method}: {r:.2f}x")
    for baseline in ("ps1", "gloo"):  # a transport that made the loss free gains at most this over the baseline
        for stat in ("p50", "p99"):
            cost = _cost(results, "loss", baseline, stat)
            if cost is not None:
                lines.append(
                    f"loss     {stat} of {baseline} over its lossless {stat} (what the loss costs TCP): {cost:.2f}x"
                )
    p99 = _cost(results, "incast", "ps1", "p99")
    if p99 is not None:
        lines.append(f"incast   p99 of ps1 over its lossless p99 (what incast costs TCP): {p99:.2f}x")
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per scenario: the distribution of round times per method (1 - CDF on a log scale, so the tail
    reads off the right), p50 and p99 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    entries = report["scenarios"]
    fig, axes = plt.subplots(1, len(entries), figsize=(5.0 * len(entries), 4.2), squeeze=False)
    colors = {name: plt.get_cmap("tab10")(i) for i, name in enumerate(METHODS)}
    for ax, (name, entry) in zip(axes[0], entries.items(), strict=True):
        for method, m in entry["methods"].items():
            xs = np.sort(np.asarray(m["round_ms"]))
            ys = 1.0 - np.arange(len(xs)) / len(xs)
            r = m["round"]
            label = f"{method}: p50 {r['p50_ms']:.0f}, p99 {r['p99_ms']:.0f} ms"
            ax.step(xs, ys, where="post", color=colors[method], label=label)
            ax.plot([r["p50_ms"], r["p99_ms"]], [0.5, 0.01], "o", color=colors[method], markersize=4)
        ax.set_yscale("log")
        ax.set_title(textwrap.fill(f"{name}: {entry['description']}", 60), fontsize=8)
        ax.set_xlabel("round time, ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("fraction of rounds slower than x")
    meta = report["meta"]
    fig.suptitle(
        f"{meta['config']['senders']} senders, {meta['gradient_mib']:.2f} MiB of gradient in "
        f"{len(meta['partitions_numel'])} partitions, {meta['compute_ms']:.0f} ms of compute per round "
        f"(timed rounds: {meta['config']['rounds']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
