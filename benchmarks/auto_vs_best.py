"""``policy="auto"`` against the best configuration measured beside it, per link shaping, paired per repeat.

    python benchmarks/auto_vs_best.py benchmarks/results/auto-significance/bench.json [more.json ...]

Prints a Markdown table (one row per session): the best other configuration,
auto's time over it with a 95 % confidence interval, and whether auto is
significantly slower (one-sided paired t-test at 5 %; Wilcoxon beside it).
See :mod:`commsched.bench.significance`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from commsched.bench.report import shaping
from commsched.bench.significance import auto_vs_best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="bench.json files of `commsched bench`")
    args = parser.parse_args()
    print("| model, workers | link | best other | repeats | auto ÷ best (95 % CI) | t-test p | Wilcoxon p | verdict |")
    print("|---|---|---|---:|---|---:|---:|---|")
    for path in args.reports:
        report = json.loads(path.read_text())
        config = report["meta"]["config"]
        for session in report["sessions"]:
            v = auto_vs_best(session)
            if v is None:
                continue
            wil = "—" if v.p_wilcoxon is None else f"{v.p_wilcoxon:.3f}"
            verdict = "**slower**" if v.significantly_slower else "not slower"
            print(
                f"| {config['model']}, {config['workers']} | {shaping(session)} | {v.best} | {v.repeats} | "
                f"{v.ratio:.3f} ({v.ci_low:.3f}–{v.ci_high:.3f}) | {v.p_slower:.3f} | {wil} | {verdict} |"
            )


if __name__ == "__main__":
    main()
