"""Plans for heterogeneous clusters: per-rank batches, per-bucket sync and the policy, scored by simulation.

HeteroG (Yi et al., CoNEXT 2020; ``research/heterog.md``) searches, per group
of operations, which devices replicate it and whether its gradients are
summed by a parameter server or an all-reduce, and orders execution by
priority; a learned policy proposes strategies and its own simulator scores
them. This planner covers the part of that space a data-parallel PyTorch job
can run and this simulator can score:

* **per-rank batch sizes** summing to the global batch ``B``. The balanced
  split minimises the slowest rank's compute time under the simulator's
  compute model: bisection on the finish time ``T``, where ``b_i(T)`` is the
  largest batch rank ``i`` computes within ``T`` (at most what fits in its
  memory); the smallest ``T`` with ``Σ b_i(T) ≥ B`` is found and the surplus
  taken from the ranks that finish last. Integers throughout, so the
  rounding is exact and keeps ``B``. HeteroG expresses uneven splits as
  replica multiplicity (ratios such as 2:1); continuous shares are strictly
  more expressive (§6.8 of the notes). Every rank keeps at least one sample.
* **per-bucket sync**: collective all-reduce, parameter server, or each
  bucket by the cheaper of the two (:data:`~commsched.plan.search.SYNC_MODES`),
  where the cluster lists servers;
* **bucket order and fusion**: the lossless policy and its knobs, searched by
  :func:`~commsched.plan.search.search_policies` (the same search as ``advise``);
* **memory**: a hard constraint per device (:mod:`commsched.plan.memory`).

The plan's :class:`~commsched.schedule.CommPlan` carries the per-rank batches
(``batch_sizes``); the runtime weights each rank's gradient by ``b_i / B``, so
training equals one process on the global batch (``docs/runtime.md``).

Candidate splits (balanced, speed-proportional, even, and blends of balanced
and even) are screened first with the overlap bound
(:func:`commsched.sim.ideal.ideal`), which costs no simulation; only the best
few are searched. Those splits balance compute alone; the best candidates'
splits are then refined by local search with communication in the
simulation (:mod:`commsched.plan.refine`), and a refined split faster than
every searched one gets the policy search too. Baselines are simulated
beside the plan with PyTorch DDP's defaults: even DP by all-reduce, even DP
by PS (with servers) and speed-proportional DP (shares ∝ samples/s,
largest-remainder rounding). The planner never returns a plan its simulator
scores slower than the best baseline that fits in memory: it returns that
baseline instead and says so.

Every rank holds the whole model here; when that does not fit, the refusal
is an :class:`~commsched.plan.memory.OutOfMemoryError` and
:mod:`commsched.plan.staged` places pipeline stages instead. Equal
micro-batches with uneven accumulation counts: ``micro_batch``. Not covered:
dropping a device.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import ScheduleError
from commsched.plan.batches import balanced_split, candidate_splits, even_split, proportional_split, rank_compute_fn
from commsched.plan.budget import Budget
from commsched.plan.hetero_result import BASELINE_POLICY, Baseline, HeteroPlan
from commsched.plan.memory import InfeasibleError, MemoryModel, OutOfMemoryError, batch_caps, rank_memory
from commsched.plan.refine import refine_split
from commsched.plan.search import Candidate, Progress, search_policies, simulate_candidate
from commsched.plan.servers import runtime_servers
from commsched.schedule import knobs as policy_knobs
from commsched.sim.compute import PROFILE, ComputeModel
from commsched.sim.ideal import ideal
from commsched.sim.options import SimOptions
from commsched.workload import Workload


def plan_heterogeneous(
    workload: Workload,
    cluster: Cluster,
    *,
    global_batch: int | None = None,
    budget_s: float = 10.0,
    memory_margin: float = 0.1,
    memory: MemoryModel | None = None,
    sim_options: SimOptions | Mapping[str, Any] | None = None,
    compute: ComputeModel = PROFILE,
    seed: int = 0,
    trials: int = 10,
    search_top: int = 3,
    top_policies: int = 3,
    policies: Sequence[str] | None = None,
    iterations: int = 4,
    warmup: int = 2,
    progress: Progress | None = None,
    micro_batch: int | None = None,
) -> HeteroPlan:
    """The plan of the module docstring for ``workload`` on ``cluster``.

    ``micro_batch``: every rank's batch a multiple of it, run as equal
    micro-batches with uneven accumulation counts (BatchNorm's statistics are
    then over equal batches on every rank; only one micro-batch's activations
    need to fit). The plan carries it (``CommPlan.micro_batch``).

    ``global_batch``: samples per iteration over all ranks (default: the
    workload's batch on every rank). ``memory_margin``: the fraction of each
    device's memory left unused. ``search_top``: how many screened splits get
    the policy search, ``trials`` knob trials per policy each; the first split's
    ``top_policies`` best policies (by their defaults) get the knob search and
    final simulations, and are the only policies the later splits try.
    ``policies``: the policies searched (default: every lossless one).
    ``iterations`` (after ``warmup``) are simulated per candidate: the
    flow-level simulation is periodic once warm, so 4 after 2 (and the knob
    trials' 2 after 2) give the time of 20 after 3 to within 1e-12 on the
    presets and models tried, at a quarter of the cost.
    ``budget_s`` is a hard bound on the wall-clock time of the whole search
    (:mod:`commsched.plan.budget`; ``HeteroPlan.search_s`` reports it, and
    ``budget_exhausted`` whether it cut anything). Raises InfeasibleError
    naming the device and the shortfall when a device cannot hold one sample,
    or when the global batch does not fit in all devices together.
    """
    budget = Budget(budget_s)
    if compute is not PROFILE:
        raise ScheduleError("plan: only the profile compute model is supported by the search today")
    opts = SimOptions.from_mapping(sim_options)
    memory = memory or MemoryModel()
    n = cluster.num_workers
    B = workload.batch_size * n if global_batch is None else global_batch
    notes: list[str] = []
    if memory.activation_bytes(workload) is None:
        notes.append(
            "activation memory not modelled: the workload records no activation_bytes_per_sample, "
            "so only parameters, gradients and optimizer state are checked against device memory"
        )
    caps = batch_caps(workload, cluster, memory, memory_margin)
    compute_s = rank_compute_fn(workload, cluster, compute, opts.update_ms)
    has_servers = cluster.servers is not None
    syncs = ("collective", "ps", "cheaper") if has_servers else ("collective",)

    # candidate splits (in whole micro-batches when there are micro-batches)
    speeds = [
        workload.batch_size / compute_s(r, workload.batch_size) for r in range(n)
    ]  # samples/s at the profile batch
    caps, splits, even, proportional = candidate_splits(B, caps, compute_s, speeds, micro_batch, cluster)
    fits = {s: all(b <= c for b, c in zip(s, caps, strict=True)) for s in splits}

    # screen: the overlap bound under each sync's cost model, no simulation
    def bound_ms(split: tuple[int, ...]) -> float:
        algorithms = [opts.algorithm] + (["ps"] if has_servers else [])
        return min(
            ideal(workload, cluster, replace(opts, algorithm=a), batch_sizes=split).iteration_ms for a in algorithms
        )

    screened = sorted((s for s in splits if fits[s]), key=lambda s: (bound_ms(s), splits[s]))
    chosen_splits = screened[:search_top]

    # baselines (before the search, so the search gets what is left of the budget)
    done = 0
    exhausted = False

    def count(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(what, done)

    baselines = []
    for name, split, sync in (
        ("even_allreduce", even, "collective"),
        ("even_ps", even, "ps"),
        ("proportional_allreduce", proportional, "collective"),
    ):
        if sync == "ps" and not has_servers:
            notes.append(f"baseline {name} not simulated: {cluster.name} lists no parameter servers")
            continue
        result = budget.run(
            BASELINE_POLICY,
            iterations + warmup,
            functools.partial(
                simulate_candidate,
                workload,
                cluster,
                BASELINE_POLICY,
                sync=sync,
                batch_sizes=split,
                options=opts,
                iterations=iterations,
                warmup=warmup,
            ),
            interruptible=False,  # the floor: a plan is always set beside its baselines
        )
        assert result is not None
        count(name)
        over = [r for r in range(n) if split[r] > caps[r]]
        note = ""
        if over:
            r = over[0]
            w = cluster.workers[r]
            note = f"rank {r} ({w.device.name}) needs batch {split[r]}, fits {caps[r]}"
        baselines.append(Baseline(name, split, sync, result, not over, note))

    # search the best screened split with the policy search advise uses; the next splits with its best policies
    best: tuple[Candidate, tuple[int, ...]] | None = None
    simulations = done
    label = ""
    searched = 0
    searching: Sequence[str] | None = policies
    quick_total = (max(2, iterations // 4) + 2) * len(syncs)

    def relay(what: str, k: int) -> None:
        if progress is not None:
            progress(f"{label}: {what}", simulations + k)

    finalists: list[tuple[Candidate, tuple[int, ...]]] = []  # the screened splits' fully simulated candidates

    def search_split(split: tuple[int, ...], share: Budget) -> tuple[Candidate, ...]:
        nonlocal simulations, searched, exhausted
        outcome = search_policies(
            workload,
            cluster,
            policies=searching,
            syncs=syncs,
            batch_sizes=split,
            sim_options=opts,
            budget=share,
            trials=trials,
            seed=seed,
            iterations=iterations,
            warmup=warmup,
            progress=relay,
            top=top_policies,
            finals=top_policies,
        )
        simulations += outcome.simulations
        budget.simulations += outcome.simulations
        searched += 1
        exhausted = exhausted or outcome.budget_exhausted
        return outcome.candidates

    for i, split in enumerate(chosen_splits):
        label = f"{splits[split]} split"
        # each screened split an equal share of what is left, the refinement (below) one more
        share = budget.share(budget.left_s() / (len(chosen_splits) - i + 1))
        # a later split is searched when its policies' defaults and the finals of the best fit
        floor = len(searching or ()) * quick_total + top_policies * (iterations + warmup)
        if i > 0 and not budget.fits(BASELINE_POLICY, floor):
            notes.append(f"budget reached: {len(chosen_splits) - i} screened split(s) not searched")
            break
        candidates = search_split(split, share)
        finalists.extend((c, split) for c in candidates if c.iterations == iterations)
        if i == 0:
            searching = [c.policy for c in candidates[:top_policies]]
        top = candidates[0]
        if best is None or top.iteration_ms < best[0].iteration_ms:
            best = (top, split)

    # refine: the best candidates' splits by local search; a split better than every searched one gets the
    # policy search too, and its best candidates the local search again (until no refined split is better)
    unit = micro_batch or 1
    searched_splits = set(chosen_splits[:searched])
    refined_from: set[tuple[str, str, str, tuple[int, ...]]] = set()
    todo = sorted(finalists, key=lambda cs: (cs[0].iteration_ms, cs[0].policy))[:top_policies]
    # it ends a twentieth of the budget before the deadline, leaving the plan's assembly room
    refining = budget.share(budget.left_s() - budget.budget_s / 20)
    while best is not None and todo and not refining.exhausted:
        improved = False
        for cand, split in todo:
            if _setting(cand, split) in refined_from:
                continue
            refined_from.add(_setting(cand, split))
            label = f"refining {cand.policy} from split {'/'.join(map(str, split))}"
            out = refine_split(
                workload, cluster, cand, split, caps, unit=unit, options=opts, budget=refining,
                iterations=iterations, warmup=warmup, progress=relay,
            )  # fmt: skip
            simulations += out.simulations
            exhausted = exhausted or out.exhausted
            refined_from.add(_setting(out.candidate, out.split))
            if out.candidate.iteration_ms < best[0].iteration_ms:
                notes.append(
                    f"split refined by local search ({cand.policy}): {'/'.join(map(str, split))} "
                    f"{cand.iteration_ms:.0f} ms -> {'/'.join(map(str, out.split))} "
                    f"{out.candidate.iteration_ms:.0f} ms predicted"
                )
                best = (out.candidate, out.split)
                improved = True
        if not improved or best[1] in searched_splits or refining.exhausted:
            break
        searched_splits.add(best[1])
        label = f"refined split {'/'.join(map(str, best[1]))}"
        new = search_split(best[1], refining.share(refining.left_s() / 2))
        if new[0].iteration_ms < best[0].iteration_ms:
            best = (new[0], best[1])
        todo = [(c, best[1]) for c in new[:top_policies] if c.iterations == iterations]

    feasible = [b for b in baselines if b.fits]
    fallback = min(feasible, key=lambda b: b.iteration_ms) if feasible else None
    if best is None and fallback is None:
        raise OutOfMemoryError(f"plan: no split of batch {B} fits on {cluster.name}")
    if best is not None and (fallback is None or best[0].iteration_ms <= fallback.iteration_ms):
        cand, split = best
        policy, knobs, sync, result, chosen = cand.policy, cand.knobs, cand.sync, cand.result, "search"
    else:
        assert fallback is not None
        policy, knobs, sync, result = BASELINE_POLICY, policy_knobs(BASELINE_POLICY), fallback.sync, fallback.result
        split, chosen = fallback.batch_sizes, f"baseline:{fallback.name}"
        notes.append(f"no searched plan beat the {fallback.name} baseline under the simulator: it is the plan")
    tasks = result.plan.tasks if result.plan is not None else ()
    if sync != "collective" and any(t.transport == "ps" for t in tasks):
        by_ps = sum(t.transport == "ps" for t in tasks)
        notes.append(f"sync {sync}: {by_ps} of the {policy} plan's {len(tasks)} tasks go by parameter server")
    servers, server_note = runtime_servers(cluster, result.plan)
    if server_note:
        notes.append(server_note)
    return HeteroPlan(
        model=workload.model,
        cluster=cluster.name,
        global_batch=B,
        batch_sizes=split,
        policy=policy,
        knobs=knobs,
        sync=sync,
        result=result,
        baselines=tuple(baselines),
        memory=rank_memory(workload, cluster, memory, memory_margin, tuple(min(b, micro_batch or b) for b in split)),
        chosen=chosen,
        splits_screened=len(screened),
        splits_searched=searched,
        simulations=simulations,
        search_s=budget.elapsed_s(),
        budget_s=budget_s,
        budget_exhausted=exhausted,
        notes=tuple(notes),
        servers=servers,
        micro_batch=micro_batch,
    )


def _setting(cand: Candidate, split: tuple[int, ...]) -> tuple[str, str, str, tuple[int, ...]]:
    """What identifies a candidate's setting at a split (its knobs as text: they hold floats and bools)."""
    return (cand.policy, repr(sorted(cand.knobs.items())), cand.sync, split)


__all__ = [
    "BASELINE_POLICY",
    "Baseline",
    "HeteroPlan",
    "InfeasibleError",
    "MemoryModel",
    "balanced_split",
    "even_split",
    "plan_heterogeneous",
    "proportional_split",
]
