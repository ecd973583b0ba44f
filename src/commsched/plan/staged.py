"""Plans with pipeline stages, for models (or batches) that data parallelism cannot fit.

HeteroG's biggest wins are where plain data parallelism runs out of memory on
the smaller devices (Yi et al., CoNEXT 2020; ``research/heterog.md`` §3).
:func:`plan_deployment` first asks :func:`~commsched.plan.hetero.plan_heterogeneous`
(every rank the whole model); when that is refused for memory it keeps the
refusal (naming the device and the shortfall) and places layer ranges on
devices instead, as HetPipe's virtual workers do (Park et al., ATC 2020):

* every rank that holds the whole model and one sample is a pipeline of its
  own (its batch in the fewest equal micro-batches that fit); the others
  (the *small* ranks: those that cannot hold one sample, or, when the global
  batch is what does not fit, those below an even share) are
  grouped, in node order, into chains of ``d`` ranks (the extra ones joining
  the last chains), for a few ``d`` from 2 up; when the small ranks alone
  cannot hold the model, the whole ranks with the least memory join them;
* each chain's cuts come from :func:`~commsched.plan.pipeline.best_cuts`
  (dynamic programming over layer ranges, memory a hard constraint) for every
  micro-batch size dividing its batch, the fastest kept;
* the global batch is split over the pipelines by the bisection of
  :func:`~commsched.plan.batches.balanced_split`, on each pipeline's time;
* every stage's gradients are summed over its holders (one per pipeline)
  after backward: a ring all-reduce each (``commsched.formulas``), over the
  slowest NIC among them.

Predicted iteration = the slowest pipeline's makespan + the stage all-reduces.
It is an analytical estimate (:mod:`commsched.plan.pipeline`), not a
simulation: the simulator does not run pipeline stages. The candidate with
the smallest estimate is returned as a :class:`StagedPlan`, whose
:class:`~commsched.schedule.CommPlan` carries the stages (``CommPlan.stages``)
and one all-reduce task per stage; ``parallelize(model, optimizer, plan=...)``
runs it on an ``nn.Sequential`` (``docs/planning.md``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from commsched.cluster import Cluster
from commsched.formulas import ring_all_reduce_s
from commsched.plan.batches import balanced_split, rank_compute_fn
from commsched.plan.hetero import HeteroPlan, plan_heterogeneous
from commsched.plan.memory import InfeasibleError, MemoryModel, OutOfMemoryError, format_gib, usable_bytes
from commsched.plan.pipeline import Chain, LayerCosts, best_cuts, chain_ms, evaluate, layer_costs
from commsched.schedule import CommPlan, make_knobs
from commsched.schedule.base import CommTask, NetworkEstimate, Segment
from commsched.schedule.stages import Pipeline, StageLayout
from commsched.sim.costs import CommModel
from commsched.workload import Workload

#: Chain depths tried beyond the smallest that fits.
EXTRA_DEPTHS = 2


@dataclass(frozen=True)
class StagedPlan:
    """A plan with pipeline stages, its estimate, and why data parallelism was refused."""

    model: str
    cluster: str
    global_batch: int
    layout: StageLayout
    plan: CommPlan
    iteration_ms: float
    pipeline_ms: tuple[float, ...]
    sync_ms: float
    used_bytes: tuple[float, ...]
    usable_bytes: tuple[float, ...]
    dp_refusal: str
    candidates: int
    search_s: float
    notes: tuple[str, ...] = ()

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / (self.iteration_ms / 1e3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "cluster": self.cluster,
            "global_batch": self.global_batch,
            "stages": self.layout.to_dict(),
            "stage_layers": [
                [self.plan.workload.layers[i].name for i in self.layout.layers_of(s, len(self.plan.workload.layers))]
                for s in range(self.layout.num_stages)
            ],
            "iteration_ms": self.iteration_ms,
            "samples_per_s": self.samples_per_s,
            "pipeline_ms": list(self.pipeline_ms),
            "sync_ms": self.sync_ms,
            "memory_used_bytes": list(self.used_bytes),
            "memory_usable_bytes": list(self.usable_bytes),
            "data_parallel_refused": self.dp_refusal,
            "candidates": self.candidates,
            "search_s": self.search_s,
            "estimate": "analytical (pipeline makespan + stage all-reduces), not simulated",
            "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        self.plan.save(path)
        return path


def plan_deployment(
    workload: Workload,
    cluster: Cluster,
    *,
    global_batch: int | None = None,
    memory_margin: float = 0.1,
    memory: MemoryModel | None = None,
    stages: bool = True,
    **search: Any,
) -> HeteroPlan | StagedPlan:
    """:func:`plan_heterogeneous`, or, when it is refused for memory (:class:`OutOfMemoryError`) and
    ``stages``, :func:`plan_stages`."""
    try:
        return plan_heterogeneous(
            workload, cluster, global_batch=global_batch, memory_margin=memory_margin, memory=memory, **search
        )
    except OutOfMemoryError as exc:
        if not stages:
            raise
        B = workload.batch_size * cluster.num_workers if global_batch is None else global_batch
        return plan_stages(workload, cluster, B, memory_margin=memory_margin, memory=memory, dp_refusal=str(exc))


def plan_stages(
    workload: Workload,
    cluster: Cluster,
    global_batch: int,
    *,
    memory_margin: float = 0.1,
    memory: MemoryModel | None = None,
    schedule: str = "1f1b",
    dp_refusal: str = "",
) -> StagedPlan:
    """The staged plan of the module docstring; InfeasibleError naming the ranks when no chain fits."""
    start = time.perf_counter()
    memory = memory or MemoryModel()
    n, B = cluster.num_workers, global_batch
    usable = usable_bytes(cluster, memory_margin)
    caps = [memory.max_batch(workload, u) for u in usable]
    speeds = cluster.worker_speeds(workload.model)
    costs = layer_costs(workload, memory)
    small = [r for r in range(n) if caps[r] < 1] or [r for r in range(n) if caps[r] < math.ceil(B / n)]
    whole_by_memory = sorted((r for r in range(n) if r not in small), key=lambda r: (usable[r], r))
    best: tuple[float, StagedPlan] | None = None
    tried = 0
    members = list(small)
    while True:
        chained = sorted(members, key=lambda r: (cluster.workers[r].node, r))
        first_fit: int | None = None
        for depth in range(2, len(chained) + 1):
            if first_fit is not None and depth > first_fit + EXTRA_DEPTHS:
                break
            for kind in (schedule, "gpipe") if schedule != "gpipe" else ("gpipe",):
                plan = _candidate(workload, cluster, costs, chained, depth, caps, usable, speeds, B, kind)
                tried += 1
                if plan is not None and (best is None or plan.iteration_ms < best[0]):
                    best = (plan.iteration_ms, plan)
                if plan is not None and first_fit is None:
                    first_fit = depth
        if best is not None or len(members) == n:
            break
        members.append(whole_by_memory[len(members) - len(small)])
    if best is None:
        need = sum(costs.state_bytes) + sum(costs.activation_bytes)
        raise InfeasibleError(
            f"plan: {workload.model} does not fit even in pipeline stages over all {n} ranks of {cluster.name}: "
            f"one sample needs {format_gib(need)}, together they have {format_gib(sum(usable))} usable"
        )
    return replace(best[1], dp_refusal=dp_refusal, candidates=tried, search_s=time.perf_counter() - start)


def _candidate(
    workload: Workload,
    cluster: Cluster,
    costs: LayerCosts,
    chained: list[int],
    depth: int,
    caps: list[int],
    usable: tuple[float, ...],
    speeds: tuple[float, ...],
    B: int,
    schedule: str,
) -> StagedPlan | None:
    """Chains of ``depth`` over ``chained``, every other rank whole: the plan, or None if a chain cannot fit."""
    count = len(chained) // depth
    chains = [chained[i * depth : (i + 1) * depth] for i in range(count)]
    for i, extra in enumerate(chained[count * depth :]):
        chains[-1 - (i % count)].append(extra)
    chains = [sorted(c, key=lambda r: (cluster.workers[r].node, r)) for c in chains]
    whole = [r for r in range(cluster.num_workers) if r not in chained]
    compute_s = rank_compute_fn(workload, cluster)

    # cuts for micro-batches of one sample (the least memory), then every micro-batch size checked on them
    chain_cuts = [best_cuts(costs, cluster, c, usable, speeds, 1, len(c), schedule) for c in chains]
    if any(c is None for c in chain_cuts):
        return None

    @cache
    def chain_plan(c: int, batch: int) -> tuple[float, Chain, int] | None:
        """The fastest micro-batching of ``batch`` samples through chain ``c`` under ``schedule``: (ms, cuts, M)."""
        out = None
        d, cut = len(chains[c]), chain_cuts[c]
        assert cut is not None
        for micro in (m for m in range(1, batch + 1) if batch % m == 0):
            count = batch // micro
            if schedule == "1f1b" and count < d:
                continue  # 1F1B needs a micro-batch per stage
            chain = evaluate(costs, cluster, chains[c], cut.starts, usable, speeds, micro, count, schedule)
            if chain is not None and (out is None or chain_ms(chain, count) < out[0]):
                out = (chain_ms(chain, count), chain, count)
        return out

    smallest = len(max(chains, key=len)) if schedule == "1f1b" else 1
    if any(chain_plan(c, smallest) is None for c in range(len(chains))):
        return None
    units = [(r,) for r in whole] + [tuple(c) for c in chains]

    def unit_s(u: int, batch: int) -> float:
        if u < len(whole):
            return compute_s(whole[u], batch)
        found = chain_plan(u - len(whole), batch)
        return math.inf if found is None else found[0] / 1e3

    unit_caps = [B] * len(units)  # in micro-batches that fit (one sample each at least), any batch fits
    try:
        split = balanced_split(B, unit_caps, unit_s, len(units))
    except InfeasibleError:
        return None
    chosen = [chain_plan(c, split[len(whole) + c]) for c in range(len(chains))]
    if any(x is None for x in chosen):
        return None
    return _assemble(workload, cluster, whole, split, chosen, usable, compute_s, costs, schedule, caps)


def _assemble(
    workload: Workload,
    cluster: Cluster,
    whole: list[int],
    split: tuple[int, ...],
    chosen: list[Any],
    usable: tuple[float, ...],
    compute_s: Any,
    costs: LayerCosts,
    schedule: str,
    caps: list[int],
) -> StagedPlan:
    n = cluster.num_workers
    starts = sorted({s for x in chosen for s in x[1].starts} | {0})
    # a whole-model rank runs its batch in the fewest equal micro-batches that fit its memory
    micro = [max(m for m in range(1, min(b, caps[r]) + 1) if b % m == 0) for r, b in zip(whole, split, strict=False)]
    pipelines = [Pipeline((r,), (0,), split[i], split[i] // micro[i]) for i, r in enumerate(whole)]
    used = [0.0] * n
    pipeline_ms = [compute_s(r, split[i]) * 1e3 for i, r in enumerate(whole)]
    for r, m in zip(whole, micro, strict=True):
        used[r] = sum(costs.state_bytes) + sum(costs.activation_bytes) * m
    for c, (ms, chain, count) in enumerate(chosen):
        first = tuple(starts.index(s) for s in chain.starts)
        pipelines.append(Pipeline(tuple(chain.ranks), first, split[len(whole) + c], count))
        pipeline_ms.append(ms)
        for r, u in zip(chain.ranks, chain.used_bytes, strict=True):
            used[r] = u
    layout = StageLayout(tuple(starts), tuple(pipelines), schedule)  # type: ignore[arg-type]
    plan = staged_commplan(workload, cluster, layout)
    sync_ms = 0.0
    for task in plan.tasks:
        holders = layout.holders(layout.stage_of_layer(workload.tensor_layer[task.segments[0].tensor]))
        if len(holders) > 1:
            nic = min((cluster.workers[r].nic for r in holders), key=lambda link: link.bandwidth_gbps)
            alpha = (nic.latency_us + nic.per_message_overhead_us) * 1e-6
            sync_ms += 1e3 * ring_all_reduce_s(task.bytes, len(holders), alpha, nic.bandwidth_bytes_per_s)
    notes = (
        "the iteration time is an analytical estimate (slowest pipeline's makespan + stage all-reduces); "
        "the simulator does not run pipeline stages",
    )
    return StagedPlan(
        model=workload.model,
        cluster=cluster.name,
        global_batch=sum(split),
        layout=layout,
        plan=plan,
        iteration_ms=max(pipeline_ms) + sync_ms,
        pipeline_ms=tuple(pipeline_ms),
        sync_ms=sync_ms,
        used_bytes=tuple(used),
        usable_bytes=tuple(usable),
        dp_refusal="",
        candidates=0,
        search_s=0.0,
        notes=notes,
    )


def staged_commplan(workload: Workload, cluster: Cluster, layout: StageLayout) -> CommPlan:
    """The CommPlan that runs ``layout``: one all-reduce task per stage with parameters (its tensors), ``ddp``
    updating at step."""
    tasks: list[CommTask] = []
    for s in range(layout.num_stages):
        tensors = [t for t, li in enumerate(workload.tensor_layer) if layout.stage_of_layer(li) == s]
        if tensors:
            segments = tuple(Segment(t, 0, workload.tensors[t].numel) for t in tensors)
            nbytes = sum(workload.tensors[t].bytes for t in tensors)
            tasks.append(CommTask(len(tasks), "all_reduce", segments, nbytes, f"stage{s}", priority=s))
    network: NetworkEstimate = CommModel.from_cluster(cluster).estimate()
    return CommPlan("ddp", workload, network, tuple(tasks), "step", make_knobs("ddp"), stages=layout)
