"""Searching plans: knob search for one policy; later policy='auto', advise and heterogeneous plans.

Every candidate is scored by :mod:`commsched.sim`; nothing here executes a plan.
"""

from commsched.plan.tune import TuneResult, search_space, tune

__all__ = ["TuneResult", "search_space", "tune"]
