"""Communication policies: one file each, all driven through the :mod:`base` contract.

``build_scheduler(name, workload, network, **knobs)`` builds a policy's plan and
its online state machine; unknown names and bad knobs raise a clear error.
The contract is interpreted by :class:`~commsched.schedule.dispatch.Dispatcher`,
for the simulator and the runtime alike.
"""

from __future__ import annotations

from commsched.schedule.base import (
    Action,
    CommTask,
    Launch,
    NetworkEstimate,
    Scheduler,
    Segment,
    Wait,
)
from commsched.schedule.dispatch import Dispatcher, Start
from commsched.schedule.knobs import Knobs
from commsched.schedule.plan import CommPlan
from commsched.schedule.registry import (
    AUTO,
    LOSSLESS,
    POLICIES,
    RUNTIME_POLICIES,
    TORCH_DDP,
    TORCH_DDP_AS_POLICY,
    build_plan,
    build_scheduler,
    knob_class,
    knobs,
    make_knobs,
    policy_class,
    provisional_plan,
    reference_plan,
    scheduler_for,
    updating_at,
    updating_like,
)

__all__ = [
    "AUTO",
    "LOSSLESS",
    "POLICIES",
    "RUNTIME_POLICIES",
    "TORCH_DDP",
    "TORCH_DDP_AS_POLICY",
    "Action",
    "CommPlan",
    "CommTask",
    "Dispatcher",
    "Knobs",
    "Launch",
    "NetworkEstimate",
    "Scheduler",
    "Segment",
    "Start",
    "Wait",
    "build_plan",
    "build_scheduler",
    "knob_class",
    "knobs",
    "make_knobs",
    "policy_class",
    "provisional_plan",
    "reference_plan",
    "scheduler_for",
    "updating_at",
    "updating_like",
]
