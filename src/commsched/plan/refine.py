"""A plan's batch split refined by local search, every move scored by simulation.

The candidate splits of :mod:`commsched.plan.batches` balance compute alone.
Communication does not cost every rank alike: on a CPU a task that runs
beside compute slows it (the cluster spec's ``overlap_ms_per_mb`` and
``overlap_ms_per_task``), a slow link stretches the ranks behind it, and
the knobs that overlap most pay off only where the split leaves the ranks
they slow some room. A split that balances compute and communication
together is found here, by a local search over the split for a fixed
policy, knobs and sync:

* a **move** takes ``step`` units (samples, or micro-batches) from ranks of
  one kind (same device and links) and gives them to ranks of another,
  within the receivers' memory caps, every rank keeping at least one unit.
  Ranks of a kind limit the iteration together, so per ordered pair of
  kinds two moves are tried: from its rank with the largest batch to the
  other's with the smallest, and ``step`` from every rank of the one spread
  over the ranks of the other;
* every move of one unit is simulated, and the fastest taken while it beats
  the split it came from (steepest descent), then doubled (2, 4, 8 ... units)
  while that is faster still (a line search: large batches move far in few
  simulations, and the search is over when no one-unit move is faster).

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
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
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

    Ranks with equal ``keys[r]`` are of one kind. For each ordered pair of kinds (giver, taker) two
    moves: ``step`` from the giver's rank with the largest batch to the taker's with the smallest, and
    ``step`` from every rank of the giver spread as evenly as can be over the taker's ranks, smallest
    batches first (alike ranks are the bottleneck together, so moving one of them alone changes
    nothing). ``caps[r]`` is rank ``r``'s largest batch; splits are in the units the caps are in, and
    every rank keeps at least 1.
    """
    kinds: dict[object, list[int]] = {}
    for r, key in enumerate(keys):
        kinds.setdefault(key, []).append(r)
    out: dict[tuple[int, ...], None] = {}
    for givers in kinds.values():
        largest = max(givers, key=lambda r: (split[r], -r))
        for takers in kinds.values():
            if takers is givers:
                continue
            by_batch = sorted(takers, key=lambda r: (split[r], r))
            for moved_from, receivers in (([largest], by_batch[:1]), (givers, by_batch)):
                if any(split[r] - step < 1 for r in moved_from):
                    continue
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
    """The local search of the module docstring from ``split`` (in samples), for ``candidate``'s setting.

    ``caps``: each rank's largest batch in samples; ``unit``: batches stay multiples of it.
    ``candidate.result`` must be the simulation of ``split`` with ``iterations`` after ``warmup``.
    ``progress(what, simulations so far)`` after each simulation.
    """
    keys = [(repr(w.device), repr(w.nic), repr(w.intra)) for w in cluster.workers]
    unit_caps = [c // unit for c in caps]
    current = tuple(b // unit for b in split)
    best_result = candidate.result
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
        for moved in moves(current, unit_caps, keys, 1):
            if moved in seen:
                continue
            seen.add(moved)
            result = simulate(moved)
            if exhausted:
                break
            beats = best_result if best_move is None else best_move[1]
            if result is not None and result.iteration_ms < beats.iteration_ms:
                best_move = (moved, result)
        if best_move is None:
            break
        # the line search: the same move doubled while that is faster still
        delta = [m - c for m, c in zip(best_move[0], current, strict=True)]
        scale = 2
        while not exhausted:
            further = tuple(c + scale * d for c, d in zip(current, delta, strict=True))
            if further in seen or not all(1 <= b <= cap for b, cap in zip(further, unit_caps, strict=True)):
                break
            seen.add(further)
            result = simulate(further)
            if result is None or result.iteration_ms >= best_move[1].iteration_ms:
                break
            best_move = (further, result)
            scale *= 2
        current, best_result = best_move
        taken += 1
    refined = Candidate(
        candidate.policy, candidate.knobs, candidate.sync, candidate.trials, best_result, candidate.iterations
    )
    return Refined(refined, tuple(b * unit for b in current), taken, simulations, exhausted)
