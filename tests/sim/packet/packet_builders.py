"""Small clusters and fabrics for packet-level tests."""

from __future__ import annotations

from commsched.cluster import Cluster
from commsched.sim.packet import PacketConfig, build
from commsched.sim.packet.fabric import Fabric
from commsched.workload import Workload


def cluster(hosts: int, gbps: float = 10.0, latency_us: float = 10.0, servers: int = 0) -> Cluster:
    """``hosts`` single-device nodes with one NIC each."""
    nic = {"bandwidth_gbps": gbps, "latency_us": latency_us}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    spec: dict[str, object] = {"name": f"packet-{hosts}", "nodes": nodes}
    if servers:
        spec["servers"] = {"count": servers, "colocated": False, "link": nic}
    return Cluster.from_dict(spec)


def nodes(
    count: int,
    per_node: int,
    gbps: float = 10.0,
    latency_us: float = 10.0,
    intra_gbps: float = 80.0,
    intra_latency_us: float = 2.0,
    overhead_us: float = 0.0,
    intra_overhead_us: float = 0.0,
) -> Cluster:
    """``count`` nodes of ``per_node`` devices: a NIC each, and an intra-node link when ``per_node > 1``."""
    nic = {"bandwidth_gbps": gbps, "latency_us": latency_us, "per_message_overhead_us": overhead_us}
    intra = {"bandwidth_gbps": intra_gbps, "latency_us": intra_latency_us, "per_message_overhead_us": intra_overhead_us}
    spec = [
        {"name": f"n{i}", "count": per_node, "device": {"name": "gpu", "memory_gib": 16}, "nic": nic}
        | ({"intra": intra} if per_node > 1 else {})
        for i in range(count)
    ]
    return Cluster.from_dict({"name": f"packet-{count}x{per_node}", "nodes": spec})


def fabric(hosts: int, config: PacketConfig, gbps: float = 10.0, latency_us: float = 10.0) -> Fabric:
    return build(cluster(hosts, gbps, latency_us), config).fabric


def one_tensor(nbytes: int) -> Workload:
    """One layer of one float32 tensor of ``nbytes`` and 10 µs of compute each way: a lone all-reduce."""
    layer = {"name": "l0", "tensors": [{"name": "w", "numel": nbytes // 4}], "forward_ms": 0.01, "backward_ms": 0.01}
    return Workload.from_dict(
        {
            "model": "one-tensor",
            "batch_size": 32,
            "device": "test",
            "layers": [layer],
            "provenance": {"kind": "estimated", "source": "test"},
        }
    )
