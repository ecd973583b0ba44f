"""A plan's batch split refined by local search, every move scored by simulation.

The candidate splits of :mod:`commsched.plan.batches` balance compute alone.
Communication does not cost every rank alike: on a CPU a task that runs
beside compute slows it (the cluster spec's ``overlap_ms_per_mb``), a slow
link stretches the ranks behind it, and the knobs that overlap most pay
off only where the split leaves the ranks they slow some room. A split
that balances compute and communication together is found here, by a
pattern search over the split for a fixed policy, knobs and sync:

* a **move** takes ``step`` units (samples, or micro-batches) from one rank
  and gives them to another, within the receiver's memory cap, every rank
  keeping at least one unit. Ranks with the same device, links and batch are
  interchangeable, so one move is tried per ordered pair of such groups;
* every move is simulated, and the fastest taken while it beats the split it
  came from (steepest descent); when none does, ``step`` halves, down to one
  unit. The first step is an eighth of the mean batch (at least one unit).

Simulations go through the search's :class:`~commsched.plan.budget.Budget`;
the search stops, with the best split so far, when the next one does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from commsched.cluster import Cluster
from commsched.errors import CommschedError
from commsched.plan.budget import Budget
from commsched.plan.search import Candidate, simulate_candidate
from commsched.sim.simulator import SimOptions, SimResult
from commsched.workload import Workload

__all__ = ["Refined", "moves", "refine_split"]


@dataclass(frozen=True)
class Refined:
    """The best split found for one candidate, its simulated result, and how the search went."""

    candidate: Candidate
    split: tuple[int, ...]
    moves: int
    simulations: int
    #: a simulation that did not fit in the budget was skipped
    exhausted: bool


def moves(split: Sequence[int], caps: Sequence[int], keys: Sequence[object], step: int) -> list[tuple[int, ...]]:
    """Every split one move of ``step`` away (see the module docstring), one per ordered pair of rank groups.

    ``keys[r]`` says which ranks are interchangeable besides their batch; ``caps[r]`` is rank ``r``'s
    largest batch. Splits are in the units the caps are in; each rank keeps at least 1.
    """
    firsts: dict[tuple[object, int], int] = {}
    for r, (key, b) in enumerate(zip(keys, split, strict=True)):
        firsts.setdefault((key, b), r)
    reps = sorted(firsts.values())
    out = []
    for giver in reps:
        if split[giver] - step < 1:
            continue
        for taker in reps:
            if taker != giver and split[taker] + step <= caps[taker]:
                moved = list(split)
                moved[giver] -= step
                moved[taker] += step
                out.append(tuple(moved))
    return out


def refine_split(
    workload: Workload,
    cluster: Cluster,
    candidate: Candidate,
    split: Sequence[int],
    caps: Sequence[int],
    *,
    unit: int = 1,
    options: SimOptions,
    budget: Budget,
    iterations: int,
    warmup: int,
    progress: Callable[[str, int], None] | None = None,
) -> Refined:
    """The pattern search of the module docstring from ``split`` (in samples), for ``candidate``'s setting.

    ``caps``: each rank's largest batch in samples; ``unit``: batches stay multiples of it.
    ``candidate.result`` must be the simulation of ``split`` with ``iterations`` after ``warmup``.
    ``progress(what, simulations so far)`` after each simulation.
    """
    keys = [(repr(w.device), repr(w.nic), repr(w.intra)) for w in cluster.workers]
    unit_caps = [c // unit for c in caps]
    current = tuple(b // unit for b in split)
    best_result = candidate.result
    step = max(1, round(sum(current) / len(current) / 8))
    simulations = taken = 0
    exhausted = False
    seen: set[tuple[int, ...]] = {current}

    def simulate(units: tuple[int, ...]) -> SimResult | None:
        nonlocal simulations, exhausted
        if not budget.fits(candidate.policy, iterations + warmup):
            exhausted = True
            budget.skipped += 1
            return None

        def run() -> SimResult | None:
            try:
                return simulate_candidate(
                    workload, cluster, candidate.policy, candidate.knobs, sync=candidate.sync,
                    batch_sizes=[b * unit for b in units], options=options, iterations=iterations, warmup=warmup,
                )  # fmt: skip
            except CommschedError:
                return None  # a split the policy or the simulator refuses is no move

        result = budget.run(candidate.policy, iterations + warmup, run)
        simulations += 1
        if progress is not None:
            progress(f"{candidate.policy} split {'/'.join(str(b * unit) for b in units)}", simulations)
        return result

    while not exhausted:
        best_move: tuple[tuple[int, ...], SimResult] | None = None
        for moved in moves(current, unit_caps, keys, step):
            if moved in seen:
                continue
            seen.add(moved)
            result = simulate(moved)
            if exhausted:
                break
            if result is None:
                continue
            beats = best_result if best_move is None else best_move[1]
            if result.iteration_ms < beats.iteration_ms:
                best_move = (moved, result)
        if best_move is not None:
            current, best_result = best_move
            taken += 1
        elif step > 1:
            step //= 2
        else:
            break
    refined = Candidate(
        candidate.policy, candidate.knobs, candidate.sync, candidate.trials, best_result, candidate.iterations
    )
    return Refined(refined, tuple(b * unit for b in current), taken, simulations, exhausted)
