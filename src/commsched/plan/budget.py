"""A search's wall-clock budget as a hard bound.

Every simulation of a search goes through one :class:`Budget`. It learns
what a simulated iteration costs (per policy: a policy that sends one task
per tensor costs several times one that fuses them), and
:meth:`Budget.fits` says whether a simulation of ``n`` iterations would end
before the deadline, its cost estimated as the mean per-iteration cost seen
for that policy (for a policy not seen yet, the largest policy mean) times
``n`` times :data:`SAFETY`; the search skips what does not fit. Estimates
can be wrong (a policy not seen yet, a machine that other work slows down),
so on the main thread :meth:`Budget.run` also interrupts a simulation still
running :data:`GRACE_S` after the deadline (``SIGALRM``; its result is
dropped and the search goes on with what it has). The alarm repeats every
:data:`GRACE_S` until the simulation has ended: an interruption raised while
Python runs a finalizer or a weakref callback is dropped there (the
simulation's ``sys.unraisablehook`` drops it unprinted), and the next one
ends the simulation; while that hook reports any other exception, the
alarms are held off, so that a report is never interrupted half-way. The budget is therefore
passed by at most :data:`GRACE_S`, plus what always runs, the search's
floor: the baselines a plan is compared with, and the first policy's
defaults in each search (one short simulation), so that a search always
returns a candidate. Off the main thread only the estimates bound it.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

#: Estimates are this much above the slowest per-iteration cost seen (simulation times vary with load).
SAFETY = 1.25
#: A simulation still running this long after the deadline is interrupted (main thread only).
GRACE_S = 0.05

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
        self._per_iteration_s: dict[str, list[float]] = {}

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
        means = {p: sum(costs) / len(costs) for p, costs in self._per_iteration_s.items()}
        seen = means.get(policy, max(means.values(), default=0.0))
        return seen * iterations * SAFETY

    def fits(self, policy: str, iterations: int, reserve_s: float = 0.0) -> bool:
        """Whether such a simulation, and then ``reserve_s`` more, end before the deadline."""
        return time.perf_counter() + self.estimate_s(policy, iterations) + reserve_s <= self.deadline

    def run(self, policy: str, iterations: int, simulate: Callable[[], T], *, interruptible: bool = True) -> T | None:
        """``simulate()`` (a simulation of ``iterations``, warm-up included), learning its cost.

        Returns None, and counts it as skipped, when it was interrupted at the deadline plus
        :data:`GRACE_S` (``interruptible``, on the main thread: see the module docstring).
        """
        began = time.perf_counter()
        armed = interruptible and threading.current_thread() is threading.main_thread()
        if armed and self.deadline + GRACE_S <= began:
            self.skipped += 1
            return None
        result: T | None = None
        try:
            old = signal.signal(signal.SIGALRM, _overtime) if armed else None
            hook = sys.unraisablehook
            try:
                if armed:
                    sys.unraisablehook = _Unraisable(hook)
                    signal.setitimer(signal.ITIMER_REAL, self.deadline + GRACE_S - began, GRACE_S)
                result = simulate()
            finally:
                if armed:
                    _disarm(old)
                    sys.unraisablehook = hook
        except _Overtime:
            if result is None:  # (the alarm may also fire just after the simulation ended: then keep it)
                self.skipped += 1
                return None
        per_iteration = (time.perf_counter() - began) / max(1, iterations)
        self._per_iteration_s.setdefault(policy, []).append(per_iteration)
        self.simulations += 1
        return result

    @property
    def exhausted(self) -> bool:
        return self.skipped > 0 or not math.isfinite(self.left_s()) or self.left_s() <= 0


class _Overtime(Exception):
    """A simulation ran past its search's deadline."""


#: Set while an unraisable exception is reported: an alarm then waits for the next repetition.
_reporting = False


def _overtime(signum: int, frame: FrameType | None) -> None:
    if not _reporting:
        raise _Overtime


class _Unraisable:
    """A simulation's ``sys.unraisablehook``: drops an interruption raised where Python cannot raise (a finalizer,
    a weakref callback), and reports anything else through ``report`` with the alarms held off."""

    __slots__ = ("report",)

    def __init__(self, report: Callable[[sys.UnraisableHookArgs], object]) -> None:
        self.report = report

    def __call__(self, unraisable: sys.UnraisableHookArgs) -> None:
        global _reporting
        if unraisable.exc_type is _Overtime:
            return
        outermost = not _reporting  # not one raised while reporting another
        _reporting = True
        try:
            self.report(unraisable)
        finally:
            if outermost:
                _reporting = False


def _disarm(old: signal.Handlers | Callable[[int, FrameType | None], object] | int | None) -> None:
    """Stop the alarm, then give ``SIGALRM`` back to ``old``; an alarm that fires meanwhile is dropped."""
    while True:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            return
        except _Overtime:
            continue
