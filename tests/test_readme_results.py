"""README's simulated table is what the code gives today (regenerated, compared cell by cell)."""

from __future__ import annotations

import re
from pathlib import Path

from commsched.cluster import load_cluster
from commsched.plan.advise import overlap_bound
from commsched.schedule import POLICIES
from commsched.sim import simulate
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
        # the bound `commsched compare` prints: over every policy it runs, the parameter server's among them
        bound = overlap_bound(workload, cluster, None, [(p, {}) for p in POLICIES])
        times.setdefault("ideal (lower bound)", []).append(bound.iteration_ms)
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


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_benchmarks_md_name_headings_that_exist() -> None:
    root = README.parent
    headings = (root / "BENCHMARKS.md").read_text().splitlines()
    anchors = {_slug(line.lstrip("#")) for line in headings if re.match(r"#{1,6} ", line)}
    assert _slug("`ps` with 1 MiB fusion: the target met, 2-3 % lost (2 workers)") == (
        "ps-with-1-mib-fusion-the-target-met-2-3--lost-2-workers"
    )
    linked = [
        (path.name, anchor)
        for path in (README, *sorted((root / "docs").glob("*.md")))
        for anchor in re.findall(r"BENCHMARKS\.md#([\w\-]+)", path.read_text())
    ]
    assert linked, "no links into BENCHMARKS.md found: the pattern is wrong"
    assert [link for link in linked if link[1] not in anchors] == []
