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
from commsched.profile.network import CpuFit
from commsched.schedule import build_plan
from commsched.sim import CommModel, SimOptions, simulate
from commsched.workload import Workload

__all__ = ["gloo_options", "predict"]


def gloo_options(workload: Workload, cluster: Cluster, policy: str, **knobs: Any) -> SimOptions:
    """Simulator options that match ``commsched.runtime`` on gloo (CPU tensors).

    * ``algorithm="ring"``: gloo's all-reduce is a ring (``gloo::allreduce``
      with no algorithm set runs its ring), and the runtime's reduce-scatter
      and all-gather are rings of point-to-point steps.
    * ``max_concurrent``: the runtime's agent issues collectives without
      waiting for earlier ones. Its all-reduces go to gloo, whose process group
      serves them on 2 worker threads (``ProcessGroupGloo::Options::threads``
      defaults to 2), so 2 can be in flight; its reduce-scatters and
      all-gathers go to one ring thread (``Collectives``), one at a time. So 2
      when the policy's plan is all all-reduces, else 1.
    * ``update_ms=0``: a profile from :func:`commsched.profile.profile_model`
      has no optimizer step in it; pass ``update_ms`` to :func:`predict` to
      add one.
    """
    plan = build_plan(policy, workload, CommModel.from_cluster(cluster).estimate(), **knobs)
    all_reduce_only = all(task.kind == "all_reduce" for task in plan.tasks)
    return SimOptions(algorithm="ring", max_concurrent=2 if all_reduce_only else 1)


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
) -> dict[str, float]:
    """Predicted iteration time in ms of each policy, by :func:`commsched.sim.simulate`.

    ``options``: simulator options for every policy; default
    :func:`gloo_options` per policy (the runtime on gloo) with ``update_ms``
    and, given the probe's ``cpu`` fit, communication's CPU work charged to
    compute (``SimOptions.cpu_per_task_ms``/``cpu_ms_per_mb``).
    ``knobs``: per policy, its knobs. Raises what ``simulate`` raises.
    """
    out: dict[str, float] = {}
    for policy in policies:
        policy_knobs = dict((knobs or {}).get(policy, {}))
        if options is None:
            base = gloo_options(workload, cluster, policy, **policy_knobs)
            opts: SimOptions | Mapping[str, Any] = SimOptions(
                base.algorithm,
                base.max_concurrent,
                update_ms,
                cpu_per_task_ms=cpu.per_op_ms if cpu is not None else 0.0,
                cpu_ms_per_mb=cpu.ms_per_mb if cpu is not None else 0.0,
            )
        else:
            opts = options
        result = simulate(workload, cluster, policy, iterations, warmup, options=opts, trace=False, **policy_knobs)
        out[policy] = result.iteration_ms
    return out
