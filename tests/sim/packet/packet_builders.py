"""Small clusters and fabrics for packet-level tests."""

from __future__ import annotations

from commsched.cluster import Cluster
from commsched.sim.packet import PacketConfig, build
from commsched.sim.packet.fabric import Fabric


def cluster(hosts: int, gbps: float = 10.0, latency_us: float = 10.0, servers: int = 0) -> Cluster:
    """``hosts`` single-device nodes with one NIC each."""
    nic = {"bandwidth_gbps": gbps, "latency_us": latency_us}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(hosts)]
    spec: dict[str, object] = {"name": f"packet-{hosts}", "nodes": nodes}
    if servers:
        spec["servers"] = {"count": servers, "colocated": False, "link": nic}
    return Cluster.from_dict(spec)


def fabric(hosts: int, config: PacketConfig, gbps: float = 10.0, latency_us: float = 10.0) -> Fabric:
    return build(cluster(hosts, gbps, latency_us), config).fabric
