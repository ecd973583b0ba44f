"""The policies, by name: the one registry every command, driver and planner reads.

``build_plan(name, workload, network, **knobs)`` checks the knobs (names,
types and ranges, through the policy's :class:`~commsched.schedule.knobs.Knobs`)
and builds the policy's :class:`~commsched.schedule.plan.CommPlan`;
``build_scheduler`` adds its online state machine. ``provisional_plan`` is what
a driver runs before it knows the real order and timings of a model (the
runtime's warm-up): one all-reduce of every gradient after backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from commsched.errors import ScheduleError
from commsched.schedule.base import NetworkEstimate, Scheduler
from commsched.schedule.bytescheduler import ByteSchedulerScheduler
from commsched.schedule.ddp import DDPScheduler
from commsched.schedule.dear import DeARScheduler
from commsched.schedule.dlcp import DLCPScheduler
from commsched.schedule.horovod import HorovodScheduler
from commsched.schedule.knobs import Knobs
from commsched.schedule.mgwfbp import MGWFBPScheduler
from commsched.schedule.no_overlap import NoOverlapScheduler
from commsched.schedule.plan import CommPlan
from commsched.schedule.prophet import ProphetScheduler
from commsched.schedule.ps import PSScheduler
from commsched.schedule.wfbp import WFBPScheduler
from commsched.workload import Workload

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        DDPScheduler,
        WFBPScheduler,
        MGWFBPScheduler,
        HorovodScheduler,
        ByteSchedulerScheduler,
        ProphetScheduler,
        DeARScheduler,
        PSScheduler,
        DLCPScheduler,
        NoOverlapScheduler,
    )
}

#: Policies that never lose or change a gradient.
LOSSLESS: frozenset[str] = frozenset(name for name, cls in POLICIES.items() if cls.lossless)

#: PyTorch's own ``DistributedDataParallel``, the baseline the runtime runs as it is (no schedule of ours).
TORCH_DDP = "torch_ddp"

#: ``torch_ddp`` as a policy of ours: ``find_unused_parameters=True`` keeps DDP's initial buckets (it does
#: not rebuild them in gradient-ready order), which is ``ddp`` with ``rebuilt=False`` (checked against
#: ``DistributedDataParallel._get_ddp_logging_data()``, torch 2.13).
TORCH_DDP_AS_POLICY: tuple[str, dict[str, Any]] = ("ddp", {"rebuilt": False})

#: Not a policy: the runtime measures the model and the network, then runs the plan that ``commsched advise``
#: would choose (every lossless policy with its knobs searched by simulation), and re-plans on drift.
AUTO = "auto"

#: Every name ``parallelize(policy=...)`` and ``commsched bench`` accept.
RUNTIME_POLICIES: tuple[str, ...] = (TORCH_DDP, AUTO, *POLICIES)


def updating_at(mode: str) -> tuple[str, ...]:
    """The policies whose plans update the model at ``mode`` (``"step"`` or ``"forward"``), in registry order."""
    return tuple(name for name, cls in POLICIES.items() if cls.update_mode == mode)


def updating_like(policies: Iterable[str]) -> frozenset[str]:
    """Every policy that updates where one of ``policies`` does (at ``step()``, or in the next forward)."""
    return frozenset(name for mode in {policy_class(p).update_mode for p in policies} for name in updating_at(mode))


def policy_class(name: str) -> type[Scheduler]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ScheduleError(f"policy: unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


def knob_class(name: str) -> type[Knobs]:
    return policy_class(name).knob_type


def knobs(name: str) -> dict[str, Any]:
    """A policy's knobs and their defaults."""
    return knob_class(name).defaults()


def make_knobs(name: str, values: Knobs | Mapping[str, Any] | None = None) -> Knobs:
    """The policy's knobs from a mapping (checked: names, types, ranges) or as given."""
    cls = knob_class(name)
    if isinstance(values, Knobs):
        if not isinstance(values, cls):
            raise ScheduleError(f"{name}: knobs of type {type(values).__name__} given; expected {cls.__name__}")
        return values
    return cls.parse(values)


def build_plan(name: str, workload: Workload, network: NetworkEstimate, **knob_values: Any) -> CommPlan:
    cls = policy_class(name)
    plan = cls.build_plan(workload, network, make_knobs(name, knob_values))
    if plan.update != cls.update_mode:
        raise ScheduleError(f"{name}: built a plan with update={plan.update!r}, declares {cls.update_mode!r}")
    return plan


def build_scheduler(name: str, workload: Workload, network: NetworkEstimate, **knob_values: Any) -> Scheduler:
    return scheduler_for(build_plan(name, workload, network, **knob_values))


def scheduler_for(plan: CommPlan) -> Scheduler:
    """The online state machine of the plan's policy, over that plan."""
    return policy_class(plan.policy)(plan)


def provisional_plan(workload: Workload, network: NetworkEstimate) -> CommPlan:
    """What a driver runs before it has measured the model: every gradient all-reduced after backward."""
    return build_plan(NoOverlapScheduler.name, workload, network)


def reference_plan(workload: Workload, network: NetworkEstimate) -> CommPlan:
    """PyTorch DDP's schedule at its defaults: what a user runs without a scheduler, the yardstick a driver
    measures its choice against."""
    return build_plan(DDPScheduler.name, workload, network)
