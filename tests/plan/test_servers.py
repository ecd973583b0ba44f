"""Where the runtime runs a plan's parameter servers: the cluster's colocated servers, else every rank."""

from __future__ import annotations

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.plan.search import simulate_candidate
from commsched.plan.servers import runtime_servers


def test_colocated_servers_run_on_the_first_rank_of_their_node_and_others_on_every_rank() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("hetero-8-ps")
    by_ps = simulate_candidate(workload, cluster, "ddp", sync="ps", iterations=2, warmup=1).plan
    assert runtime_servers(cluster, by_ps) == ((0, 2, 4, 6), "")
    collective = simulate_candidate(workload, cluster, "ddp", iterations=2, warmup=1).plan
    assert runtime_servers(cluster, collective) == (None, "")
    sharded = simulate_candidate(workload, cluster, "dear", sync="ps", iterations=2, warmup=1).plan
    assert runtime_servers(cluster, sharded) == (
        None,
        "sharded tasks go by parameter server: the runtime runs a server on every rank",
    )
    dedicated = load_cluster("ec2-ps-3gbps")
    servers, note = runtime_servers(
        dedicated, simulate_candidate(workload, dedicated, "ddp", sync="ps", iterations=2).plan
    )
    assert servers is None and note.startswith("the cluster's 2 dedicated parameter server(s) have no rank")
