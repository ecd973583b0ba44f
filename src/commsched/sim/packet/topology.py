"""Fabrics built from a cluster spec: one switch, or a two-tier leaf-spine.

One host per worker (rank order), with its node's NIC rate, half the NIC's
``latency_us`` on each of its two directions (so two hosts under one switch
are ``latency_us`` apart) and the node's ``per_message_overhead_us`` before
each message it sends. Dedicated parameter servers are hosts too, after the
workers, with the servers' link; colocated servers live on the first worker
host of their node.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsched.cluster import Cluster, Link
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.fabric import Fabric, Host, Port


@dataclass(frozen=True)
class Built:
    """A fabric and which hosts play which role: ``workers[rank]``, ``servers[i]`` (host indices)."""

    fabric: Fabric
    workers: tuple[int, ...]
    servers: tuple[int, ...]


def _host_links(cluster: Cluster) -> tuple[list[tuple[str, Link]], tuple[int, ...], tuple[int, ...]]:
    hosts: list[tuple[str, Link]] = [(f"w{w.rank}", w.nic) for w in cluster.workers]
    workers = tuple(range(len(hosts)))
    servers: tuple[int, ...] = ()
    if cluster.servers is not None:
        if cluster.servers.colocated:
            first_rank: dict[int, int] = {}
            for w in cluster.workers:
                first_rank.setdefault(w.node, w.rank)
            servers = tuple(first_rank[i] for i in range(cluster.servers.count))
        else:
            link = cluster.servers.link
            assert link is not None  # enforced by the spec's validation
            servers = tuple(range(len(hosts), len(hosts) + cluster.servers.count))
            hosts.extend((f"ps{i}", link) for i in range(cluster.servers.count))
    return hosts, workers, servers


def build(cluster: Cluster, config: PacketConfig) -> Built:
    """The fabric ``config.topology`` names, with hosts from ``cluster`` (module docstring)."""
    fabric = Fabric(config)
    specs, workers, servers = _host_links(cluster)
    hosts: list[Host] = []
    down: list[Port] = []  # the switch port facing each host
    for name, link in specs:
        host = fabric.add_host(name, link.per_message_overhead_us * 1e-6)
        half_s = link.latency_us * 1e-6 / 2
        host.nic = fabric.add_port(f"{name}>up", link.bandwidth_gbps, half_s, host=True)
        down.append(fabric.add_port(f"{name}<down", link.bandwidth_gbps, half_s))
        hosts.append(host)
    n = len(hosts)
    if config.topology == "single_switch":
        for s in range(n):
            for d in range(n):
                if s != d:
                    nic = hosts[s].nic
                    assert nic is not None
                    fabric.paths[(s, d)] = [(nic, down[d])]
        return Built(fabric, workers, servers)

    per_leaf = config.hosts_per_leaf
    leaves = (n + per_leaf - 1) // per_leaf
    fabric_gbps = config.fabric_gbps or max(link.bandwidth_gbps for _, link in specs)
    prop_s = config.fabric_latency_us * 1e-6
    up = [
        [fabric.add_port(f"leaf{i}>spine{s}", fabric_gbps, prop_s) for s in range(config.spines)] for i in range(leaves)
    ]
    spine_down = [
        [fabric.add_port(f"spine{s}>leaf{i}", fabric_gbps, prop_s) for i in range(leaves)] for s in range(config.spines)
    ]
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            nic = hosts[s].nic
            assert nic is not None
            ls, ld = s // per_leaf, d // per_leaf
            if ls == ld:
                fabric.paths[(s, d)] = [(nic, down[d])]
            else:
                fabric.paths[(s, d)] = [(nic, up[ls][k], spine_down[k][ld], down[d]) for k in range(config.spines)]
    return Built(fabric, workers, servers)
