"""Communication policies: one file each, all driven through the :mod:`base` contract.

``build_scheduler(name, workload, network, **knobs)`` builds a policy's plan and
its online state machine; unknown names and knobs raise a clear error.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from commsched.errors import ScheduleError
from commsched.schedule.base import (
    Action,
    CommTask,
    Launch,
    NetworkEstimate,
    Plan,
    Scheduler,
    Segment,
    Wait,
)
from commsched.schedule.bytescheduler import ByteSchedulerScheduler
from commsched.schedule.ddp import DDPScheduler
from commsched.schedule.dear import DeARScheduler
from commsched.schedule.horovod import HorovodScheduler
from commsched.schedule.no_overlap import NoOverlapScheduler
from commsched.schedule.prophet import ProphetScheduler
from commsched.schedule.wfbp import WFBPScheduler
from commsched.workload import Workload

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        DDPScheduler,
        WFBPScheduler,
        HorovodScheduler,
        ByteSchedulerScheduler,
        ProphetScheduler,
        DeARScheduler,
        NoOverlapScheduler,
    )
}

#: Policies that never lose or change a gradient (all of them, for now).
LOSSLESS = frozenset(POLICIES)


def policy_class(name: str) -> type[Scheduler]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ScheduleError(f"policy: unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


def knobs(name: str) -> dict[str, Any]:
    """A policy's tunable knobs and their defaults."""
    sig = inspect.signature(policy_class(name).build_plan)  # type: ignore[attr-defined]
    return {p.name: p.default for p in list(sig.parameters.values())[2:]}


def _accepts_none(policy: str, knob: str) -> bool:
    """Whether the knob's annotation admits None (``float | None``)."""
    try:
        annotation = inspect.signature(policy_class(policy).build_plan).parameters[knob].annotation  # type: ignore[attr-defined]
    except (KeyError, AttributeError, ScheduleError):
        return False
    return "None" in str(annotation)


def check_knob(policy: str, knob: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the knob's default: booleans for booleans, numbers for numbers.

    A string where a number or a boolean belongs (``"False"`` from a command line) raises instead of
    being taken as true. Returns the value; raises ScheduleError naming the knob and the value.
    """
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScheduleError(f"{policy}: {knob} must be true or false, got {value!r}")
        return value
    if default is None or isinstance(default, int | float):
        if value is None:
            if default is None or _accepts_none(policy, knob):
                return None
            raise ScheduleError(f"{policy}: {knob} must be a number, got none")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScheduleError(f"{policy}: {knob} must be a number, got {value!r}")
    return value


def build_plan(name: str, workload: Workload, network: NetworkEstimate, **options: Any) -> Plan:
    cls = policy_class(name)
    allowed = knobs(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ScheduleError(f"{name}: unknown option(s) {', '.join(unknown)}; known: {', '.join(allowed) or 'none'}")
    for knob, value in options.items():
        check_knob(name, knob, value, allowed[knob])
    return cls.build_plan(workload, network, **options)  # type: ignore[attr-defined]


def build_scheduler(name: str, workload: Workload, network: NetworkEstimate, **options: Any) -> Scheduler:
    return policy_class(name)(build_plan(name, workload, network, **options))


__all__ = [
    "LOSSLESS",
    "POLICIES",
    "Action",
    "CommTask",
    "Launch",
    "NetworkEstimate",
    "Plan",
    "Scheduler",
    "Segment",
    "Wait",
    "build_plan",
    "build_scheduler",
    "check_knob",
    "knobs",
    "policy_class",
]
