"""Every configuration of a saved ``commsched bench`` run against one of them, paired per repeat.

    python benchmarks/paired_ratios.py benchmarks/results/unshaped-every-policy-fastday/bench.json [--against torch_ddp]

Per session (link shaping), one Markdown row per configuration: its median
iteration time over the repeats (min-max), the median over the repeats of
the paired ratio ``reference_k / configuration_k`` (the same repeat ``k``,
so the machine's state that repeat cancels; above 1: faster than the
reference), and the geometric mean of those ratios with a two-sided 95 %
confidence interval (Student's t on their logarithms:
:func:`commsched.bench.significance.paired_ratio`, what ``auto``'s verdicts use). The issue's
"every policy at least 0.97x ``torch_ddp``" reads off the third column.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from commsched.bench.significance import paired_ratio

HEADER = (
    "| configuration | iter ms (min–max) | vs {ref}: median of {n} paired ratios | geometric mean (95 % CI) |\n"
    "|---|---|---:|---|"
)


def rows(session: dict, against: str) -> list[str]:
    """The table of one session (module docstring); ValueError without the reference or with under 3 repeats."""
    runs = {name: {r["repeat"]: r["iteration_ms"] for r in reps} for name, reps in session["runs"].items()}
    if against not in runs:
        raise ValueError(f"session {session.get('label')!r} has no {against!r} runs (it has {sorted(runs)})")
    reference = runs[against]
    lines = [HEADER.format(ref=f"`{against}`", n=len(reference))]
    for name, reps in runs.items():
        if name == against:
            continue
        paired = paired_ratio(reference, reps)
        if paired is None:
            shared = len(reps.keys() & reference.keys())
            raise ValueError(f"{name}: {shared} repeats paired with {against}, at least 3 are needed")
        ratios = [reference[k] / ms for k, ms in reps.items() if k in reference]
        times = list(reps.values())
        lines.append(
            f"| {name} | {statistics.median(times):.0f} ({min(times):.0f}–{max(times):.0f}) | "
            f"{statistics.median(ratios):.3f} | {paired.ratio:.3f} ({paired.ci_low:.3f}–{paired.ci_high:.3f}) |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="bench.json files of `commsched bench`")
    parser.add_argument("--against", default="torch_ddp", help="the reference configuration [torch_ddp]")
    args = parser.parse_args(argv)
    for path in args.reports:
        for session in json.loads(path.read_text())["sessions"]:
            print(f"**{path}**, links {session.get('label', '')}\n")
            print("\n".join(rows(session, args.against)) + "\n")


if __name__ == "__main__":
    main()
