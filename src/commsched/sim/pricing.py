"""What each task of a plan costs, priced once before a simulation runs: phases, bytes and CPU work.

A task is priced by the cost model of its transport (:func:`comm_of`): the
options' algorithm for most, a parameter-server model for a ``"ps"`` task
whatever the option says (so a plan can send some buckets through parameter
servers and the rest by ring), and DLCP's parameter servers over the ring's
links for its transports. Its phases (:data:`~commsched.sim.costs.TASK_COSTS`)
are what the network model runs; the bytes and the CPU work are what the
simulator counts and charges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from commsched.cluster import Cluster
from commsched.schedule import CommTask
from commsched.schedule.base import PS_TRANSPORT, REDUCING_KINDS
from commsched.schedule.dlcp import DLCP_PS_TRANSPORT, DLCP_TRANSPORT
from commsched.sim.contention import task_cpu_s
from commsched.sim.costs import CommModel, Phase
from commsched.sim.options import SimOptions


@dataclass(frozen=True)
class TaskPrices:
    """Per task of a plan, by task index.

    ``phases``: what the network model runs. ``sent_bytes``: bytes each
    worker sends under the cost model. ``reduced_bytes``: gradient bytes
    reduced (0 for a task that only moves them: an RS+AG pair counts once).
    ``cpu_s``: communication's CPU work on a whole core
    (:func:`~commsched.sim.contention.task_cpu_s`). ``uncontended_s``: the
    phases' latency and transfer with nothing else in flight.
    """

    phases: list[tuple[Phase, ...]]
    sent_bytes: list[float]
    reduced_bytes: list[float]
    cpu_s: list[float]
    uncontended_s: list[float]


def price_tasks(tasks: Sequence[CommTask], comm: CommModel, cluster: Cluster, options: SimOptions) -> TaskPrices:
    """Price every task of a plan under ``comm`` (or its transport's model). Raises ScheduleError for a task kind
    the model has no cost for."""
    models: dict[str, CommModel] = {}
    comms = [comm_of(task.transport, comm, cluster, models) for task in tasks]
    phases = [model.phases(task.kind, task.bytes) for model, task in zip(comms, tasks, strict=True)]
    return TaskPrices(
        phases=phases,
        sent_bytes=[model.sent_bytes(task.kind, task.bytes) for model, task in zip(comms, tasks, strict=True)],
        reduced_bytes=[float(task.bytes) if task.kind in REDUCING_KINDS else 0.0 for task in tasks],
        cpu_s=[task_cpu_s(options, task.bytes, task.transport) for task in tasks],
        uncontended_s=[sum(ph.latency_s + ph.work_s for ph in task_phases) for task_phases in phases],
    )


def comm_of(transport: str, comm: CommModel, cluster: Cluster, models: dict[str, CommModel]) -> CommModel:
    """The cost model of a task: a ``"ps"`` task is priced by the parameter-server model, any other by ``comm``.

    A task whose ``transport`` is :data:`~commsched.schedule.base.PS_TRANSPORT`
    is priced as a parameter-server push/pull, whatever ``comm.algorithm``
    says (the cluster's servers, else one server on every worker).
    DLCP's transports are parameter servers over the ring's links: ``"dlcp"``
    with a server on every worker (its transpose all-reduce), ``"dlcp_ps"``
    with one server on a worker, ``max(n / B, N·n / B)`` per push or pull (a
    little pessimistic: the server's own slice stays local). Bytes the
    transport does not wait for are not taken off: the flow-level model
    does not price what DLCP gains (see :mod:`commsched.schedule.dlcp`).
    ``models`` caches the models built for one plan, by transport.
    """
    if transport in (DLCP_TRANSPORT, DLCP_PS_TRANSPORT):
        if transport not in models:
            ring = CommModel.from_cluster(cluster, "ring")
            one = transport == DLCP_PS_TRANSPORT
            models[transport] = dataclasses.replace(
                ring,
                algorithm="ps",
                servers=1 if one else ring.world_size,
                server_bandwidth=ring.bandwidth,
                servers_on_workers=not one,
            )
        return models[transport]
    if transport != PS_TRANSPORT or comm.algorithm == "ps":
        return comm
    if PS_TRANSPORT not in models:
        models[PS_TRANSPORT] = CommModel.from_cluster(cluster, "ps")
    return models[PS_TRANSPORT]
