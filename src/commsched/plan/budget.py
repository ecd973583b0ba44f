"""A search's wall-clock budget as a hard bound: a simulation starts only if it is expected to end in time.

Every simulation of a search goes through one :class:`Budget`. It learns
what a simulated iteration costs (per policy: a policy that sends one task
per tensor costs several times one that fuses them), and
:meth:`Budget.fits` says whether a simulation of ``n`` iterations would end
before the deadline, its cost estimated as the slowest per-iteration cost
seen for that policy (or, for a policy not seen yet, for any policy) times
``n`` times :data:`SAFETY`. The search skips what does not fit, so it
overruns its budget only by what one simulation costs beyond its estimate.
What always runs, whatever the budget, is the search's floor: the baselines
a plan is compared with, and the first policy's defaults in each search (one
short simulation), so that a search always returns a candidate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

#: Estimates are this much above the slowest per-iteration cost seen (simulation times vary with load).
SAFETY = 1.25

T = TypeVar("T")


class Budget:
    """The deadline of one search and what its simulations have cost so far (see the module docstring)."""

    __slots__ = ("_per_iteration_s", "budget_s", "deadline", "simulations", "skipped", "start")

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.start = time.perf_counter()
        self.deadline = self.start + budget_s
        self.simulations = 0
        self.skipped = 0
        self._per_iteration_s: dict[str, float] = {}

    def share(self, seconds: float) -> Budget:
        """A budget of ``seconds`` from now (never past this one's deadline) that learns into the same estimates."""
        child = Budget(seconds)
        child.deadline = min(self.deadline, child.deadline)
        child.simulations = self.simulations
        child._per_iteration_s = self._per_iteration_s
        return child

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def estimate_s(self, policy: str, iterations: int) -> float:
        """What a simulation of ``policy`` over ``iterations`` (warm-up included) is expected to cost."""
        seen = self._per_iteration_s.get(policy)
        if seen is None:
            seen = max(self._per_iteration_s.values(), default=0.0)
        return seen * iterations * SAFETY

    def fits(self, policy: str, iterations: int, reserve_s: float = 0.0) -> bool:
        """Whether such a simulation, and then ``reserve_s`` more, end before the deadline."""
        return time.perf_counter() + self.estimate_s(policy, iterations) + reserve_s <= self.deadline

    def run(self, policy: str, iterations: int, simulate: Callable[[], T]) -> T:
        """Run ``simulate()`` (a simulation of ``iterations``, warm-up included) and learn its cost."""
        began = time.perf_counter()
        try:
            return simulate()
        finally:
            per_iteration = (time.perf_counter() - began) / max(1, iterations)
            self._per_iteration_s[policy] = max(self._per_iteration_s.get(policy, 0.0), per_iteration)
            self.simulations += 1

    @property
    def exhausted(self) -> bool:
        return self.skipped > 0 or not math.isfinite(self.left_s()) or self.left_s() <= 0
