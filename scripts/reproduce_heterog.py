"""HeteroG's setup in the simulator: the section ``heterog`` of ``scripts/reproduce.py``.

HeteroG (Yi et al., CoNEXT 2020): 2x V100 on 100 GbE, 4x GTX 1080 Ti and
2x P100 on 50 GbE (the preset ``hetero-8-ps``: ``hetero-8`` with one
colocated parameter server per server, so that per-bucket PS is in the
space as it is in HeteroG's), its models VGG-19, ResNet-200, Inception-V3,
MobileNet-V2, Transformer and BERT-large (the zoo's V100 estimates). For each
model, ``commsched.plan.hetero.plan_heterogeneous`` at the zoo's batch on
every GPU (Adam's state, 10 % memory margin, the zoo's activation memory),
with a budget the search never reaches, so the result depends on the seed
only (the script refuses a row whose search the budget cut). Then
HeteroG's second experiment: ResNet-200 and BERT-large at the smallest
global batch (a multiple of 8) at which even DP no longer fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.plan.batches import rank_compute_fn
from commsched.plan.hetero import HeteroPlan, plan_heterogeneous
from commsched.plan.memory import MemoryModel, batch_caps
from commsched.sim.ideal import ideal

CLUSTER = "hetero-8-ps"
MODELS = ("vgg19", "resnet200", "inception_v3", "mobilenet_v2", "transformer", "bert_large")
LARGE_BATCH_MODELS = ("resnet200", "bert_large")
BUDGET_S = 600.0
TRIALS = 4
SEED = 0
MARGIN = 0.1
#: HeteroG's abstract; its per-model figures (Table 1) are not public (research/heterog.md, section 7).
HEADLINE = "up to 222 %"


@dataclass(frozen=True)
class HeteroRow:
    model: str
    plan: HeteroPlan
    bound_ms: float  # the overlap bound at the plan's split, by all-reduce or PS: no lossless schedule is faster
    compute_gain: float  # the slowest rank's compute under even DP over under the plan's split
    smallest_cap: int  # the largest batch the smallest device holds


def heterog_row(model: str, global_batch: int | None = None, trials: int = TRIALS) -> HeteroRow:
    workload, cluster = zoo.load(model), load_cluster(CLUSTER)
    plan = plan_heterogeneous(
        workload, cluster, global_batch=global_batch, budget_s=BUDGET_S, trials=trials, seed=SEED, memory_margin=MARGIN
    )
    if plan.budget_exhausted:
        raise SystemExit(f"heterog: the search of {model} reached its {BUDGET_S:g} s budget: not reproducible")
    compute_s = rank_compute_fn(workload, cluster)
    even = plan.baseline("even_allreduce").batch_sizes
    slowest = max(compute_s(r, b) for r, b in enumerate(even))
    gain = slowest / max(compute_s(r, b) for r, b in enumerate(plan.batch_sizes))
    algorithms = ("ring", "ps") if cluster.servers is not None else ("ring",)  # what the plan's sync may use
    split = plan.batch_sizes
    bound = min(ideal(workload, cluster, {"algorithm": a}, batch_sizes=split).iteration_ms for a in algorithms)
    caps = batch_caps(workload, cluster, MemoryModel(), MARGIN)
    return HeteroRow(model, plan, bound, gain, min(caps))


def large_batch(model: str) -> int:
    """The smallest global batch, a multiple of 8, at which even DP does not fit the smallest device."""
    cluster = load_cluster(CLUSTER)
    return cluster.num_workers * (min(batch_caps(zoo.load(model), cluster, MemoryModel(), MARGIN)) + 1)


def _ms(plan: HeteroPlan, name: str) -> str:
    b = plan.baseline(name)
    return f"{b.iteration_ms:.1f}" + ("" if b.fits else " (OOM)")


def _vs(plan: HeteroPlan, name: str) -> str:
    b = plan.baseline(name)
    return f"{(plan.speedup_over(name) - 1) * 100:+.1f} %" if b.fits else "— (OOM)"


def _batches(sizes: Sequence[int]) -> str:
    return " ".join(str(b) for b in sizes)


MAIN_HEADER = (
    "| model (global batch) | even DP all-reduce | even DP PS | speed-proportional DP | plan | plan: policy, sent by "
    "| plan: per-rank batch | plan vs even DP | plan vs proportional DP | bound vs even DP | compute balance alone |\n"
    "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"
)
LARGE_HEADER = (
    "| model (global batch) | smallest GPU holds | even DP | speed-proportional DP | plan ms | plan samples/s "
    "| plan: per-rank batch |\n|---|---:|---|---|---:|---:|---|"
)


def main_line(row: HeteroRow) -> str:
    p = row.plan
    even = p.baseline("even_allreduce")
    sent_by = "+".join(sorted(set(p.transports)))
    return (
        f"| {row.model} ({p.global_batch}) | {_ms(p, 'even_allreduce')} | {_ms(p, 'even_ps')} "
        f"| {_ms(p, 'proportional_allreduce')} | {p.iteration_ms:.1f} | {p.policy}, {sent_by} "
        f"| {_batches(p.batch_sizes)} | {_vs(p, 'even_allreduce')} | {_vs(p, 'proportional_allreduce')} "
        f"| {(even.iteration_ms / row.bound_ms - 1) * 100:+.1f} % | {(row.compute_gain - 1) * 100:+.1f} % |"
    )


def large_line(row: HeteroRow) -> str:
    p = row.plan

    def cell(name: str) -> str:
        b = p.baseline(name)
        return "fits" if b.fits else f"OOM: {b.memory_note}"

    return (
        f"| {row.model} ({p.global_batch}) | {row.smallest_cap} | {cell('even_allreduce')} "
        f"| {cell('proportional_allreduce')} | {p.iteration_ms:.1f} | {p.samples_per_s:.0f} "
        f"| {_batches(p.batch_sizes)} |"
    )


def heterog_tables(rows: Sequence[HeteroRow], large: Sequence[HeteroRow]) -> str:
    out = [f"**{CLUSTER}**, simulated iteration time in ms (lower is better); OOM: does not fit in memory:\n"]
    out += [MAIN_HEADER, *(main_line(r) for r in rows), ""]
    if large:
        out += ["Larger global batches, where even DP runs out of memory:\n", LARGE_HEADER]
        out += [large_line(r) for r in large]
    return "\n".join(out) + "\n"


def heterog_rows(models: Sequence[str], trials: int = TRIALS) -> tuple[list[HeteroRow], list[HeteroRow]]:
    rows = [heterog_row(m, trials=trials) for m in models]
    large = [heterog_row(m, large_batch(m), trials) for m in models if m in LARGE_BATCH_MODELS]
    return rows, large
