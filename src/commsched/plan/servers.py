"""Where the runtime runs a plan's parameter servers, given the cluster the plan was made for."""

from __future__ import annotations

from commsched.cluster import Cluster
from commsched.schedule import CommPlan
from commsched.schedule.base import PS_TRANSPORT


def runtime_servers(cluster: Cluster, plan: CommPlan | None) -> tuple[tuple[int, ...] | None, str]:
    """The ranks the runtime runs ``plan``'s parameter servers on (None: every rank), and a note when that
    is not the cluster's placement.

    A colocated server of node ``i`` runs on that node's first rank, as the
    simulator prices it (on the node's NIC). Dedicated servers have no rank:
    the runtime starts no processes of its own, so it runs a server on every
    rank, as it does when a plan's sharded tasks (reduce-scatter, all-gather)
    go by parameter server, which needs a server on every rank.
    """
    tasks = [t for t in (plan.tasks if plan is not None else ()) if t.transport == PS_TRANSPORT]
    if not tasks or cluster.servers is None:
        return None, ""
    if not cluster.servers.colocated:
        return None, (
            f"the cluster's {cluster.servers.count} dedicated parameter server(s) have no rank: "
            "the runtime runs a server on every rank instead"
        )
    firsts: dict[int, int] = {}
    for w in cluster.workers:
        firsts.setdefault(w.node, w.rank)
    servers = tuple(firsts[i] for i in range(cluster.servers.count))
    if len(servers) < cluster.num_workers and any(t.kind in ("reduce_scatter", "all_gather") for t in tasks):
        return None, "sharded tasks go by parameter server: the runtime runs a server on every rank"
    return servers, ""
