"""Simulator options that model :mod:`commsched.runtime` on gloo (CPU tensors).

One function (with :func:`~commsched.sim.options.measured_cpu`, a
runtime's CPU measurements in the simulator's units), used wherever a
simulation stands for the runtime on this kind of host: ``commsched bench
--validate`` (predictions beside measurements) and ``policy="auto"`` (the
search after warm-up), so what is validated is what chooses.
"""

from __future__ import annotations

from typing import Any

from commsched.cluster import Cluster
from commsched.schedule import build_plan
from commsched.sim import CommModel, SimOptions
from commsched.sim.options import measured_cpu
from commsched.workload import Workload

__all__ = ["gloo_options", "measured_cpu"]


def gloo_options(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    *,
    update_ms: float = 0.0,
    cpu_per_task_ms: float = 0.0,
    cpu_ms_per_mb: float = 0.0,
    cpu_scales_with_speed: bool = False,
    transport_cpu: tuple[tuple[str, float, float], ...] = (),
    **knobs: Any,
) -> SimOptions:
    """Simulator options for ``policy`` (with ``knobs``) run by the runtime on gloo.

    * ``algorithm="ring"``: gloo's all-reduce is a ring (``gloo::allreduce``
      with no algorithm set runs its ring), and the runtime's reduce-scatter
      and all-gather are rings of point-to-point steps.
    * ``max_concurrent``: the runtime's agent issues collectives without
      waiting for earlier ones. PyTorch DDP's all-reduces go to gloo, whose
      process group serves them on 2 worker threads
      (``ProcessGroupGloo::Options::threads`` defaults to 2), so 2 can be in
      flight; the runtime's reduce-scatters and all-gathers among more than 2
      ranks go to one ring thread (``Collectives``), one at a time. So 2 when
      the policy's plan is all all-reduces, else 1. The runtime's own
      all-reduces of CPU tensors (:mod:`commsched.transport.direct`), and
      between 2 ranks its reduce-scatters and all-gathers, are all in flight
      at once, their frames written one after another on each connection;
      they are modelled as gloo's and the ring's, as the saved reports
      measured them (the first run with the direct reduce-scatters predicted
      DeAR within 0.3 %: BENCHMARKS.md).
    * ``update_ms``: the optimizer's time per iteration (a profile from
      :func:`commsched.profile.profile_model` has none in it).
    * ``cpu_per_task_ms``, ``cpu_ms_per_mb``: communication's CPU work, which
      the transport's threads and the kernel's TCP take from compute on the same cores
      (:class:`~commsched.sim.SimOptions`); measured by the network probe or
      the runtime's warm-up; ``cpu_scales_with_speed`` where slower ranks are
      slower CPUs (:class:`~commsched.sim.SimOptions`).
    * ``transport_cpu``: the same per transport, where one was measured apart
      (the ``"ps"`` transport's push and pull: the probe's
      :data:`~commsched.profile.network.PS_OP`).
    """
    plan = build_plan(policy, workload, CommModel.from_cluster(cluster).estimate(), **knobs)
    all_reduce_only = all(task.kind == "all_reduce" for task in plan.tasks)
    return SimOptions(
        algorithm="ring",
        max_concurrent=2 if all_reduce_only else 1,
        update_ms=update_ms,
        cpu_per_task_ms=cpu_per_task_ms,
        cpu_ms_per_mb=cpu_ms_per_mb,
        cpu_scales_with_speed=cpu_scales_with_speed,
        transport_cpu=transport_cpu,
    )
