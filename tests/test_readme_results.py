"""README's simulated table is what the code gives today (regenerated, compared cell by cell)."""

from __future__ import annotations

import re
from pathlib import Path

from commsched.cluster import load_cluster
from commsched.sim import simulate
from commsched.sim.ideal import ideal
from commsched.zoo import load as load_zoo

README = Path(__file__).resolve().parents[1] / "README.md"
CLUSTERS = ("64xV100-10GbE", "64xV100-100GbIB")
ORDER = ("no_overlap", "ddp", "wfbp", "mgwfbp", "horovod", "bytescheduler", "prophet", "dear")


def table_rows() -> list[str]:
    """The README table's rows as the code computes them (20 iterations after 3 warm-up, default knobs)."""
    workload = load_zoo("resnet50")
    times: dict[str, list[float]] = {}
    for name in CLUSTERS:
        cluster = load_cluster(name)
        for policy in ORDER:
            times.setdefault(policy, []).append(simulate(workload, cluster, policy, 20, 3, trace=False).iteration_ms)
        times.setdefault("ideal (lower bound)", []).append(ideal(workload, cluster).iteration_ms)
    ddp = times["ddp"]
    return [
        f"| {name} | " + " | ".join(f"{ms:.1f} | {ddp[i] / ms:.2f}×" for i, ms in enumerate(values)) + " |"
        for name, values in times.items()
    ]


def test_the_readme_simulated_table_is_what_the_code_gives() -> None:
    text = README.read_text()
    pattern = r"\| (ideal \(lower bound\)|[a-z_]+) \| [0-9.]+ \| [0-9.]+×"
    published = [line for line in text.splitlines() if re.match(pattern, line)]
    assert published == table_rows()


if __name__ == "__main__":  # prints the rows to paste into README.md
    print("\n".join(table_rows()))
