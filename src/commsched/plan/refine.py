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
  interchangeable and limit the iteration together, so per ordered pair of
  such groups two moves are tried: one rank to one rank, and ``step`` from
  every rank of the one spread over the ranks of the other;
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
    """Every split one move of ``step`` away (see the module docstring), in a fixed order, without repeats.

    Ranks with equal ``keys[r]`` and batch form a group. For each ordered pair of groups (giver, taker)
    two moves: ``step`` from the giver's first rank to the taker's first, and ``step`` from every rank
    of the giver spread over the taker's ranks as evenly as can be (alike ranks are the bottleneck
    together, so moving one of them alone changes nothing). ``caps[r]`` is rank ``r``'s largest batch;
    splits are in the units the caps are in, and every rank keeps at least 1.
    """
    groups: dict[tuple[object, int], list[int]] = {}
    for r, (key, b) in enumerate(zip(keys, split, strict=True)):
        groups.setdefault((key, b), []).append(r)
    members = sorted(groups.values())
    out: dict[tuple[int, ...], None] = {}
    for givers in members:
        if split[givers[0]] - step < 1:
            continue
        for takers in members:
            if takers is givers:
                continue
            for moved_from, receivers in (([givers[0]], takers[:1]), (givers, takers)):
                share, extra = divmod(step * len(moved_from), len(receivers))
                moved = list(split)
                for r in moved_from:
                    moved[r] -= step
                for i, r in enumerate(receivers):
                    moved[r] += share + (1 if i < extra else 0)
                if all(moved[r] <= caps[r] for r in receivers):
                    out.setdefault(tuple(moved), None)
    return list(out)


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
