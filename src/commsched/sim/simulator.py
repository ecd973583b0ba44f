"""Driver #1 of the Scheduler contract: plan a policy for a cluster, then simulate the plan.

``simulate(workload, cluster, policy)`` builds the policy's plan with
``schedule.build_plan`` for the cost model's network estimate
(:func:`plan_for`) and replays training iterations around it
(:func:`simulate_plan`, a :class:`~commsched.sim.simulation.Simulation`: what
one iteration is, and what the simulator does with the policy's launches, is
described there).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import CommschedError, ScheduleError
from commsched.schedule import CommPlan, build_plan, scheduler_for
from commsched.sim.collector import collector_paused
from commsched.sim.compute import PROFILE, ComputeModel
from commsched.sim.costs import CommModel
from commsched.sim.network import NetworkFactory
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
from commsched.sim.simulation import Simulation
from commsched.workload import Workload


def plan_for(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    options: SimOptions | Mapping[str, Any] | None = None,
    **knobs: Any,
) -> CommPlan:
    """``policy``'s plan for ``workload`` on ``cluster``, made for the cost model's network estimate with the CPU
    work ``options`` charge.

    Raises ScheduleError for an unknown policy, knob or option, or a bad value.
    """
    opts = SimOptions.from_mapping(options)
    comm = CommModel.from_cluster(cluster, opts.algorithm)
    try:
        return build_plan(policy, workload, opts.planned_with(comm.estimate()), **knobs)
    except CommschedError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ScheduleError(f"{policy}: bad option value ({exc})") from None


def simulate_plan(
    plan: CommPlan,
    cluster: Cluster,
    iterations: int = 20,
    warmup: int = 3,
    *,
    options: SimOptions | Mapping[str, Any] | None = None,
    trace: bool = True,
    compute: ComputeModel = PROFILE,
    batch_sizes: Sequence[int] | None = None,
    network: NetworkFactory | None = None,
) -> SimResult:
    """Simulate ``plan`` (made by :func:`plan_for`, a planner or a file) under its policy's scheduler.

    ``network``: a factory for the network model (default: the one ``options.network`` names).
    """
    sim_options = SimOptions.from_mapping(options)
    comm = CommModel.from_cluster(cluster, sim_options.algorithm)
    start = time.perf_counter()
    sim = Simulation(
        plan.workload,
        cluster,
        scheduler_for(plan),
        iterations,
        warmup,
        sim_options,
        comm,
        record_trace=trace,
        compute=compute,
        network=network,
        batch_sizes=batch_sizes,
    )
    with collector_paused():
        sim.run()
    return sim.result(plan.knobs.to_dict(), time.perf_counter() - start)


def simulate(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    iterations: int = 20,
    warmup: int = 3,
    *,
    options: SimOptions | Mapping[str, Any] | None = None,
    trace: bool = True,
    compute: ComputeModel = PROFILE,
    batch_sizes: Sequence[int] | None = None,
    **knobs: Any,
) -> SimResult:
    """Simulate ``warmup + iterations`` iterations of ``policy`` on ``cluster``.

    ``knobs`` are the policy's (``schedule.knobs(policy)``); ``options`` the
    simulator's (:class:`SimOptions`). ``trace=False`` skips recording the
    Trace (faster, for searches). ``compute``: the compute model
    (:mod:`commsched.sim.compute`; default: the workload's profile scaled by
    speed and batch size). ``batch_sizes``: one per rank (default: the
    workload's batch size on every rank). Raises ScheduleError for an unknown policy,
    knob or option, a bad value, or a scheduler that breaks the contract
    (a deadlock is reported with what was waiting on what).

    >>> result = simulate(workload, load_cluster("64xV100-10GbE"), "dear")  # doctest: +SKIP
    >>> result.iteration_ms, result.samples_per_s  # doctest: +SKIP
    """
    plan = plan_for(workload, cluster, policy, options, **knobs)
    return simulate_plan(
        plan, cluster, iterations, warmup, options=options, trace=trace, compute=compute, batch_sizes=batch_sizes
    )
