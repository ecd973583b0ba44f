"""Where a run's parameter servers are: the plan's ``servers``, or ``TransportOptions.servers``.

A plan made for a cluster with parameter servers names the ranks that host
them (``CommPlan.servers``); every task the plan sends on the ``"ps"``
transport is then pushed to those ranks, each summing an even slice of it
(one server: reduce-to-owner), and pulled back from them
(:mod:`commsched.transport.exchange`). Checked at ``parallelize()``, before
any communication.
"""

from __future__ import annotations

from dataclasses import replace

from commsched.errors import PlanMismatchError, SpecError, UnsupportedError
from commsched.schedule import CommPlan
from commsched.schedule.base import PS_TRANSPORT
from commsched.schedule.plan import servers_problems
from commsched.transport import TransportOptions

#: Task kinds whose result is one rank's shard: with fewer servers than ranks some rank would own no shard.
_SHARDED = ("reduce_scatter", "all_gather")


def run_transport_options(
    plan: CommPlan | None, options: TransportOptions | None, world: int
) -> TransportOptions | None:
    """The options the run's transports open with: the user's, with the plan's servers.

    Raises SpecError for servers that are not distinct ranks of this world,
    PlanMismatchError when the plan and ``options.servers`` name different
    servers, and UnsupportedError for a sharded task (reduce-scatter,
    all-gather) on the ``"ps"`` transport with fewer servers than ranks.
    """
    given = None if options is None else options.servers
    problems = servers_problems(given, world)
    if problems:
        raise SpecError("parallelize argument transport_options", problems)
    planned = None if plan is None else plan.servers
    if given is not None and planned is not None and tuple(given) != planned:
        raise PlanMismatchError(
            f"servers: the plan has {list(planned)}, transport_options.servers has {list(given)}; give one of them"
        )
    servers = tuple(given) if given is not None else planned
    if plan is not None and servers is not None and sorted(servers) != list(range(world)):
        for task in plan.tasks:
            if task.transport == PS_TRANSPORT and task.kind in _SHARDED:
                raise UnsupportedError(
                    f"plan: task {task.name!r} is a {task.kind} on the {PS_TRANSPORT!r} transport, which needs a "
                    f"server on every rank; the plan has servers {list(servers)} of {world} ranks"
                )
    if servers is None:
        return options
    return replace(options or TransportOptions(), servers=servers)
