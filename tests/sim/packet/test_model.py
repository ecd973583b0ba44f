from __future__ import annotations

from commsched import zoo
from commsched.schedule import build_scheduler
from commsched.sim import SimOptions, Simulation, simulate
from commsched.sim.costs import CommModel
from commsched.sim.packet import PacketConfig, PacketNetwork, RedParams, packet_factory

from packet_builders import cluster


def test_a_ps_all_reduce_runs_as_pushes_and_pulls_through_the_servers() -> None:
    workload = zoo.load("resnet18")
    c = cluster(4, gbps=10.0, latency_us=10.0, servers=2)
    options = {"network": "packet", "algorithm": "ps"}
    packet = simulate(workload, c, "ddp", iterations=2, warmup=1, options=options, trace=False)
    flow = simulate(workload, c, "ddp", iterations=2, warmup=1, options={"algorithm": "ps"}, trace=False)
    # every push is a 4 -> 1 incast into a server: NewReno overflows the 1 MB buffers (about 1,100 drops and
    # 100 retransmission timeouts in the 3 iterations), which the fair-share flow level does not model
    # (measured: 189.0 ms packet level, 179.0 ms flow level, +5.6 %)
    assert flow.iteration_ms < packet.iteration_ms < 1.1 * flow.iteration_ms
    assert packet.link_utilisation["ps0<down"] > 0


def test_a_packet_config_is_given_through_a_factory_and_queue_depths_reach_the_chrome_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    workload = zoo.load("resnet18")
    c = cluster(4, gbps=10.0, latency_us=10.0)
    options = SimOptions(network="packet")
    comm = CommModel.from_cluster(c)
    scheduler = build_scheduler("ddp", workload, comm.estimate())
    config = PacketConfig(record_queues=True, buffer_bytes=200_000)
    sim = Simulation(workload, c, scheduler, 2, 1, options, comm, network=packet_factory(config))
    sim.run()
    net = sim.network
    assert isinstance(net, PacketNetwork)
    assert sim.trace is not None
    path = tmp_path / "trace.json"
    net.save_chrome(sim.trace, path)
    import json

    data = json.loads(path.read_text())
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert counters and all(e["name"].startswith("queue ") for e in counters)
    assert {row["connection"] for row in data["packet"]["connections"]} >= {"w0->w1/c0"}


def test_a_leaf_spine_with_spraying_dctcp_and_priorities_runs_a_training_job() -> None:
    workload = zoo.load("resnet18")
    c = cluster(8, gbps=10.0, latency_us=10.0)
    options = SimOptions(network="packet")
    comm = CommModel.from_cluster(c)
    scheduler = build_scheduler("wfbp", workload, comm.estimate())
    config = PacketConfig(
        topology="leaf_spine",
        hosts_per_leaf=4,
        spines=2,
        load_balancing="spray",
        transport="dctcp",
        red=RedParams(min_bytes=60_000, max_bytes=60_000),
        priority_classes=4,
    )
    sim = Simulation(workload, c, scheduler, 1, 1, options, comm, record_trace=False, network=packet_factory(config))
    sim.run()
    flow = simulate(workload, c, "wfbp", iterations=1, warmup=1, trace=False)
    result = sim.result({}, 0.0)
    assert result.iteration_ms >= flow.iteration_ms
    net = sim.network
    assert isinstance(net, PacketNetwork)
    assert {conn.cls for conn in net.connections.values()} == {0, 1, 2, 3}
    assert net.fabric.ports["leaf0>spine0"].tx_bytes and net.fabric.ports["leaf0>spine1"].tx_bytes


def test_colocated_parameter_servers_live_on_their_nodes_first_worker() -> None:
    from commsched.cluster import Cluster

    nic = {"bandwidth_gbps": 10.0, "latency_us": 10.0}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(4)]
    c = Cluster.from_dict({"name": "colocated", "nodes": nodes, "servers": {"count": 2, "colocated": True}})
    workload = zoo.load("resnet18")
    options = {"network": "packet", "algorithm": "ps"}
    packet = simulate(workload, c, "ddp", iterations=1, warmup=1, options=options, trace=False)
    flow = simulate(workload, c, "ddp", iterations=1, warmup=1, options={"algorithm": "ps"}, trace=False)
    # a colocated server's own worker pushes and pulls locally; the α-β formula charges all N workers
    # to the server's NIC (measured: 160.4 ms packet level, 179.0 ms flow level)
    assert packet.iteration_ms < flow.iteration_ms
    assert "ps0<down" not in packet.link_utilisation


def test_the_ps_policy_runs_through_a_server_on_every_worker_where_the_cluster_lists_none() -> None:
    """Every worker receives the other three's slices at once: TCP incast the flow model does not see
    (resnet18, 4 hosts, 10 Gbit/s: 125.6 ms packet level with 323 drops, 84.0 ms flow level)."""
    workload = zoo.load("resnet18")
    c = cluster(4, gbps=10.0, latency_us=10.0)
    knobs = {"partition_mb": 8.0, "credit_mb": 32.0}
    packet = simulate(workload, c, "ps", iterations=2, warmup=1, options={"network": "packet"}, trace=False, **knobs)
    flow = simulate(workload, c, "ps", iterations=2, warmup=1, trace=False, **knobs)
    assert packet.gradient_bytes == flow.gradient_bytes == workload.total_bytes
    assert flow.iteration_ms <= packet.iteration_ms < 2 * flow.iteration_ms
    assert all(packet.link_utilisation[f"w{r}<down"] > 0 for r in range(4))
