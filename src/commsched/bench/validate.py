"""Simulator predictions for a calibrated testbed: what ``commsched bench --validate`` sets beside the measurement.

::

    workload = profile_model(...)                      # compute, measured
    cluster = probe_local(world_size=4).cluster()      # network, measured
    predict(workload, cluster, ["ddp", "dear"])        # {"ddp": 812.4, "dear": 640.1} ms

Task-by-task comparison of a predicted and a measured trace is
:mod:`commsched.trace.compare`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from commsched.cluster import Cluster
from commsched.plan.gloo import gloo_options
from commsched.profile.network import ps_task_cpu
from commsched.profile.probe_fit import CpuFit
from commsched.schedule.base import PS_TRANSPORT
from commsched.sim import SimOptions, simulate
from commsched.workload import Workload

__all__ = ["predict", "ps_transport_cpu"]


def ps_transport_cpu(ps_cpu: CpuFit | None) -> tuple[tuple[str, float, float], ...]:
    """``SimOptions.transport_cpu`` from the probe's fit of a push and its pull (two tasks: half each)."""
    if ps_cpu is None:
        return ()
    task = ps_task_cpu(ps_cpu)
    return ((PS_TRANSPORT, task.per_op_ms, task.ms_per_mb),)


def predict(
    workload: Workload,
    cluster: Cluster,
    policies: Iterable[str],
    iterations: int = 20,
    *,
    warmup: int = 3,
    options: SimOptions | Mapping[str, Any] | None = None,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    update_ms: float = 0.0,
    cpu: CpuFit | None = None,
    ps_cpu: CpuFit | None = None,
) -> dict[str, float]:
    """Predicted iteration time in ms of each policy, by :func:`commsched.sim.simulate`.

    ``options``: simulator options for every policy; default
    :func:`gloo_options` per policy (the runtime on gloo) with ``update_ms``
    and, given the probe's ``cpu`` fit, communication's CPU work charged to
    compute (``SimOptions.cpu_per_task_ms``/``cpu_ms_per_mb``); given
    ``ps_cpu``, the probe's fit of a push and its pull through the ``"ps"``
    transport (:data:`~commsched.profile.network.PS_OP`), that transport's
    tasks are charged half of it each (``SimOptions.transport_cpu``).
    ``knobs``: per policy, its knobs. Raises what ``simulate`` raises.
    """
    out: dict[str, float] = {}
    for policy in policies:
        policy_knobs = dict((knobs or {}).get(policy, {}))
        if options is None:
            opts: SimOptions | Mapping[str, Any] = gloo_options(
                workload,
                cluster,
                policy,
                update_ms=update_ms,
                cpu_per_task_ms=cpu.per_op_ms if cpu is not None else 0.0,
                cpu_ms_per_mb=cpu.ms_per_mb if cpu is not None else 0.0,
                transport_cpu=ps_transport_cpu(ps_cpu),
                **policy_knobs,
            )
        else:
            opts = options
        result = simulate(workload, cluster, policy, iterations, warmup, options=opts, trace=False, **policy_knobs)
        out[policy] = result.iteration_ms
    return out
