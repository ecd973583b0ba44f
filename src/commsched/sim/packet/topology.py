"""Fabrics built from a cluster spec: one switch, or a two-tier leaf-spine, with nodes inside.

One host per worker (rank order); dedicated parameter servers are hosts too,
after the workers, with the servers' link; colocated servers live on the
first worker host of their node.

Every node, and every dedicated server, reaches the fabric through one NIC:

* a **single-device node** (or a server) is its host: the host's port
  ``w3>up`` is the NIC (the node's NIC rate, half its ``latency_us``) and
  the switch port ``w3<down`` faces it (same rate and delay), so two such
  hosts under one switch are ``latency_us`` apart, as in the α-β model;
* a **multi-device node** has a node switch on its ``intra`` link: each
  device's port ``w0>intra`` and the node switch's port ``w0<intra`` facing
  it run at the intra rate with half the intra ``latency_us`` each, the
  node's NIC is the node switch's port ``gpu1>up`` and the fabric switch's
  port ``gpu1<down`` faces it. Two devices of one node talk over the node
  switch alone (``intra`` latency apart, never touching the NIC); traffic
  off the node crosses the device's intra port and then shares the node's
  NIC, as a GPU's traffic crosses PCIe to reach its node's NIC.

Ports on the host side (NICs, device ports, node-switch ports) are deep:
unbounded, with the priority bands and no RED or pFabric; switch ports of
the fabric have the configured buffer and AQM. A message waits the
``per_message_overhead_us`` of the link it leaves its node by: the intra
link's between two devices of one node, else the NIC's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commsched.cluster import Cluster, Link
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.fabric import Fabric
from commsched.sim.packet.port import Port


@dataclass(frozen=True)
class Built:
    """A fabric and which hosts play which role: ``workers[rank]``, ``servers[i]`` (host indices).

    ``node_of[host]``: the NIC a host sits behind (nodes in order, then
    dedicated servers); ``overhead_s[host]``: its NIC's per-message overhead,
    ``intra_overhead_s[host]`` its node's intra link's (its NIC's on a
    single-device node).
    """

    fabric: Fabric
    workers: tuple[int, ...]
    servers: tuple[int, ...]
    node_of: tuple[int, ...]
    overhead_s: tuple[float, ...]
    intra_overhead_s: tuple[float, ...]

    def message_overhead_s(self, src: int, dst: int) -> float:
        """What a message from host ``src`` to host ``dst`` waits before it is sent (module docstring)."""
        if self.node_of[src] == self.node_of[dst]:
            return self.intra_overhead_s[src]
        return self.overhead_s[src]


@dataclass(frozen=True)
class _Nic:
    """One attachment to the fabric: its name, link, hosts behind it and their intra link (None: one host)."""

    name: str
    link: Link
    hosts: tuple[int, ...]
    intra: Link | None


def _attachments(cluster: Cluster) -> tuple[list[str], list[_Nic], tuple[int, ...], tuple[int, ...]]:
    names = [f"w{w.rank}" for w in cluster.workers]
    reserved = {*names, *(f"ps{i}" for i in range(cluster.servers.count if cluster.servers else 0))}
    nics: list[_Nic] = []
    for ni, node in enumerate(cluster.nodes):
        ranks = tuple(w.rank for w in cluster.workers if w.node == ni)
        if len(ranks) == 1:
            nics.append(_Nic(names[ranks[0]], node.nic, ranks, None))
        else:
            assert node.intra is not None  # required by the spec for multi-device nodes
            label = node.name if node.name not in reserved else f"node{ni}"  # port names stay unique
            nics.append(_Nic(label, node.nic, ranks, node.intra))
    workers = tuple(range(len(names)))
    servers: tuple[int, ...] = ()
    if cluster.servers is not None:
        if cluster.servers.colocated:
            servers = tuple(nics[i].hosts[0] for i in range(cluster.servers.count))
        else:
            link = cluster.servers.link
            assert link is not None  # enforced by the spec's validation
            servers = tuple(range(len(names), len(names) + cluster.servers.count))
            for i, host in enumerate(servers):
                names.append(f"ps{i}")
                nics.append(_Nic(f"ps{i}", link, (host,), None))
    return names, nics, workers, servers


def build(cluster: Cluster, config: PacketConfig) -> Built:
    """The fabric ``config.topology`` names, with hosts and nodes from ``cluster`` (module docstring)."""
    fabric = Fabric(config)
    names, nics, workers, servers = _attachments(cluster)
    n = len(names)
    node_of, overhead, intra_overhead = [0] * n, [0.0] * n, [0.0] * n
    for e, nic in enumerate(nics):
        for h in nic.hosts:
            node_of[h] = e
            overhead[h] = nic.link.per_message_overhead_us * 1e-6
            intra_overhead[h] = (nic.intra or nic.link).per_message_overhead_us * 1e-6
    hosts = [fabric.add_host(name, overhead[h]) for h, name in enumerate(names)]
    first: list[tuple[Port, ...]] = [()] * n  # a host's ports up to and including its NIC
    last: list[tuple[Port, ...]] = [()] * n  # the ports after the fabric switch's port facing its NIC
    up: list[Port] = []  # each attachment's NIC
    down: list[Port] = []  # the fabric switch's port facing each attachment
    for nic in nics:
        half_s = nic.link.latency_us * 1e-6 / 2
        gbps = nic.link.bandwidth_gbps
        up.append(fabric.add_port(f"{nic.name}>up", gbps, half_s, host=True))
        down.append(fabric.add_port(f"{nic.name}<down", gbps, half_s))
        if nic.intra is None:
            first[nic.hosts[0]] = (up[-1],)
            continue
        intra_half_s = nic.intra.latency_us * 1e-6 / 2
        for h in nic.hosts:
            to_switch = fabric.add_port(f"{names[h]}>intra", nic.intra.bandwidth_gbps, intra_half_s, host=True)
            from_switch = fabric.add_port(f"{names[h]}<intra", nic.intra.bandwidth_gbps, intra_half_s, host=True)
            first[h] = (to_switch, up[-1])
            last[h] = (from_switch,)
    for h, host in enumerate(hosts):
        host.nic = first[h][0]
    between = _between(fabric, config, nics, down)
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            es, ed = node_of[s], node_of[d]
            if es == ed:  # two devices of one node: over the node switch only
                fabric.paths[(s, d)] = [(first[s][0], last[d][0])]
            else:
                fabric.paths[(s, d)] = [first[s] + middle + last[d] for middle in between(es, ed)]
    return Built(fabric, workers, servers, tuple(node_of), tuple(overhead), tuple(intra_overhead))


def _between(
    fabric: Fabric, config: PacketConfig, nics: list[_Nic], down: list[Port]
) -> Callable[[int, int], list[tuple[Port, ...]]]:
    """``between(a, b)``: the equal-cost port sequences from attachment ``a``'s NIC to the port facing ``b``."""
    if config.topology == "single_switch":
        return lambda a, b: [(down[b],)]
    per_leaf = config.hosts_per_leaf
    leaves = (len(nics) + per_leaf - 1) // per_leaf
    fabric_gbps = config.fabric_gbps or max(nic.link.bandwidth_gbps for nic in nics)
    prop_s = config.fabric_latency_us * 1e-6
    up = [
        [fabric.add_port(f"leaf{i}>spine{s}", fabric_gbps, prop_s) for s in range(config.spines)] for i in range(leaves)
    ]
    spine_down = [
        [fabric.add_port(f"spine{s}>leaf{i}", fabric_gbps, prop_s) for i in range(leaves)] for s in range(config.spines)
    ]

    def between(a: int, b: int) -> list[tuple[Port, ...]]:
        la, lb = a // per_leaf, b // per_leaf
        if la == lb:
            return [(down[b],)]
        return [(up[la][k], spine_down[k][lb], down[b]) for k in range(config.spines)]

    return between
