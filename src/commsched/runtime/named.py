"""The planner of a policy the user named: its plan from the model and network the warm-up measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from commsched.schedule import CommPlan, NetworkEstimate, build_plan, make_knobs, policy_class
from commsched.workload import Workload

__all__ = ["NamedPlanner"]


class NamedPlanner:
    """The plan of the policy the user named, from the measured model and network (``exclude`` cannot apply:
    the user chose it)."""

    def __init__(self, policy: str, knobs: Mapping[str, Any], *, gloo: bool, host_memory: bool) -> None:
        self.policy, self.knobs = policy, dict(knobs)
        self.gloo, self.host_memory = gloo, host_memory

    def timed_apart(self) -> frozenset[str]:
        """The transports whose CPU work the policy plans with (``Scheduler.plans_with_cpu_of``: ``ps`` sizing
        its fusion from the network), on gloo with CPU tensors, where that CPU work is what the runtime's is."""
        if not (self.gloo and self.host_memory):
            return frozenset()
        return policy_class(self.policy).plans_with_cpu_of(make_knobs(self.policy, self.knobs))

    def __call__(self, workload: Workload, network: NetworkEstimate, exclude: frozenset[str]) -> CommPlan:
        return build_plan(self.policy, workload, network, **self.knobs)
