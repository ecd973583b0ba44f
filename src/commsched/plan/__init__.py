"""Searching plans: knob search for one policy, ``advise`` over every policy, heterogeneous plans.

Every candidate is scored by :mod:`commsched.sim`; nothing here executes a plan.
"""

from commsched.plan.advise import Advice, advise
from commsched.plan.search import (
    SYNC_MODES,
    Candidate,
    SearchOutcome,
    search_policies,
    simulate_candidate,
    with_sync,
)
from commsched.plan.tune import KnobSearch, TuneResult, search_space, tune

__all__ = [
    "SYNC_MODES",
    "Advice",
    "Candidate",
    "KnobSearch",
    "SearchOutcome",
    "TuneResult",
    "advise",
    "search_policies",
    "search_space",
    "simulate_candidate",
    "tune",
    "with_sync",
]
