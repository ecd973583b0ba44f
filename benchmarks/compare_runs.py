"""Two sets of saved ``commsched bench`` runs side by side: each policy's paired speed-up over torch_ddp.

    python benchmarks/compare_runs.py --before old-1.json old-2.json --after new-1.json new-2.json

Per repeat, torch_ddp's iteration time over the policy's (the same repeat, so the machine's state
cancels), then the median and range over every repeat of every run of a side, per link where the runs
shaped several. Used to check that a
change of the runtime made nothing slower (BENCHMARKS.md, "Before and after the runtime's rewrite").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def paired(paths: list[Path]) -> dict[tuple[str, str], list[float]]:
    """Per (session label: the link's shaping, policy), the paired speed-ups over torch_ddp of every run."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in paths:
        for session in json.loads(path.read_text())["sessions"]:
            runs = {name: {r["repeat"]: r["iteration_ms"] for r in reps} for name, reps in session["runs"].items()}
            reference = runs.get("torch_ddp", {})
            for name, reps in runs.items():
                if name in ("torch_ddp", "compute", "allreduce"):
                    continue
                key = (str(session.get("label", "")), name)
                out.setdefault(key, []).extend(reference[k] / ms for k, ms in reps.items() if k in reference)
    return out


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def table(before_paths: list[Path], after_paths: list[Path]) -> str:
    """The Markdown table: per policy, the median paired speed-up over torch_ddp before and after."""
    before, after = paired(before_paths), paired(after_paths)
    links = len({label for label, _ in before}) > 1  # a column for the link where the runs had several
    lines = [
        "| " + ("link | " if links else "") + "policy | before: speed-up over torch_ddp | after | after / before |",
        "|---|" + ("---|" if links else "") + "---:|---:|---:|",
    ]
    for key, values in before.items():
        if after.get(key) and values:
            b, a = statistics.median(values), statistics.median(after[key])
            label, name = key
            lines.append(
                "| " + (f"{label} | " if links else "") + f"{name} | {b:.2f}× ({_range(values)}) | "
                f"{a:.2f}× ({_range(after[key])}) | {a / b:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    args = parser.parse_args()
    print(table(args.before, args.after))


if __name__ == "__main__":
    main()
