"""α-β cost models of collectives, and how the simulator maps a cluster onto them.

Notation: ``p`` ranks, ``n`` bytes per rank (the size of the gradient piece),
``alpha_s`` the cost of one message or ring step (one-way latency plus the
per-message software overhead of the link), ``bandwidth`` in bytes/s per
direction. Reduction arithmetic (γ) is ignored: on GPUs it hides behind the
transfer. Sources: Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; NCCL's tuning model for the
tree; ``research/ecosystem.md`` §5 for the table these functions implement.

Every collective is split into :class:`Phase` objects, each a startup latency
followed by a transfer on one named link resource. The latency part does not
use bandwidth; the transfer part is ``work_s`` seconds *at the full rate of
the resource*, and concurrent transfers on one resource share it
(:mod:`commsched.sim.network`). Without contention the phases of a collective
add up exactly to the closed forms below (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from commsched.cluster import Cluster, Link
from commsched.errors import ScheduleError, SpecError
from commsched.schedule.base import NetworkEstimate

Algorithm = Literal["ring", "tree", "hierarchical", "ps"]
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "hierarchical", "ps")


# ---- closed forms (pure functions) ----


def ring_all_reduce_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring all-reduce: ``2(p-1)·α + 2(p-1)/p · n / B``; 0 when ``p == 1``."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * nbytes / bandwidth


def ring_reduce_scatter_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring reduce-scatter of ``n`` bytes (each rank keeps ``n/p``): ``(p-1)·α + (p-1)/p · n / B``."""
    if p <= 1:
        return 0.0
    return (p - 1) * alpha_s + (p - 1) / p * nbytes / bandwidth


def ring_all_gather_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring all-gather to ``n`` bytes of output: ``(p-1)·α + (p-1)/p · n / B`` (same as reduce-scatter)."""
    return ring_reduce_scatter_s(nbytes, p, alpha_s, bandwidth)


def tree_all_reduce_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Pipelined double binary tree (NCCL): ``2·⌈log2 p⌉·α + 2 · n / B``.

    Latency grows with ``log p`` instead of ``p``; the bandwidth term is about
    that of a ring for large ``p`` (NCCL converts tree bus bandwidth to
    algorithm bandwidth with a factor 1/2).
    """
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha_s + 2 * nbytes / bandwidth


def hierarchical_all_reduce_s(
    nbytes: float,
    nodes: int,
    per_node: int,
    alpha_intra_s: float,
    bandwidth_intra: float,
    alpha_inter_s: float,
    bandwidth_inter: float,
) -> float:
    """Intra-node reduce-scatter, inter-node all-reduce of the shards, intra-node all-gather.

    With ``g = per_node`` ranks per node and ``P = nodes``::

        2·[(g-1)·α_in + (g-1)/g · n / B_in]  +  2(P-1)·α_out + 2(P-1)/P · n / B_out

    The inter-node part moves ``n/g`` bytes per rank, but the ``g`` ranks of a
    node share its NIC, so the node still pushes ``2(P-1)/P · n`` bytes through
    ``B_out``: the hierarchy saves startup steps (``2(P-1)`` instead of
    ``2(gP-1)``), not NIC bytes.
    """
    intra = 2 * ring_reduce_scatter_s(nbytes, per_node, alpha_intra_s, bandwidth_intra)
    return intra + ring_all_reduce_s(nbytes, nodes, alpha_inter_s, bandwidth_inter)


def ps_push_s(
    nbytes: float, workers: int, servers: int, alpha_s: float, worker_bandwidth: float, server_bandwidth: float
) -> float:
    """Parameter-server push of ``n`` bytes sharded evenly over ``k`` servers by ``N`` workers.

    ``α + max(n / B_worker, N · n / (k · B_server))``: each worker sends ``n``
    bytes through its own NIC; each server receives ``N·n/k`` bytes through
    its NIC (incast: ``N`` senders share one server's ingress). A pull is the
    same in the other direction.
    """
    return alpha_s + max(nbytes / worker_bandwidth, workers * nbytes / (servers * server_bandwidth))


def ps_push_pull_s(
    nbytes: float, workers: int, servers: int, alpha_s: float, worker_bandwidth: float, server_bandwidth: float
) -> float:
    """Push then pull: ``2α + 2·max(n / B_worker, N · n / (k · B_server))``."""
    return 2 * ps_push_s(nbytes, workers, servers, alpha_s, worker_bandwidth, server_bandwidth)


# ---- phases: what the simulator executes ----


@dataclass(frozen=True, slots=True)
class Phase:
    """A startup latency, then ``work_s`` seconds of transfer at the full rate of ``resource``."""

    latency_s: float
    resource: str
    work_s: float


def _link_alpha_s(link: Link) -> float:
    return (link.latency_us + link.per_message_overhead_us) * 1e-6


@dataclass(frozen=True)
class CommModel:
    """The collective cost model of one cluster under one algorithm.

    ``ring`` (default; NCCL's ring, also gloo's): one flat ring over all ranks.
    Every ring step waits for its slowest hop, so ``α`` is the largest
    per-message cost of any link the ring crosses (NICs when there is more
    than one node, intra-node links of multi-device nodes) and ``B`` the
    smallest bandwidth among them.
    ``tree``: all-reduce as NCCL's double binary tree over the same links;
    reduce-scatter and all-gather stay rings (NCCL has no tree for them).
    ``hierarchical``: intra-node ring, inter-node ring over nodes, intra-node
    ring (needs the same number of devices on every node).
    ``ps``: push to and pull from the cluster's parameter servers; a
    reduce-scatter is a push, an all-gather a pull, an all-reduce both.
    """

    algorithm: Algorithm
    world_size: int
    alpha_s: float
    bandwidth: float
    nodes: int = 1
    per_node: int = 1
    alpha_intra_s: float = 0.0
    bandwidth_intra: float = math.inf
    alpha_inter_s: float = 0.0
    bandwidth_inter: float = math.inf
    servers: int = 0
    server_bandwidth: float = math.inf

    @classmethod
    def from_cluster(cls, cluster: Cluster, algorithm: str = "ring") -> CommModel:
        if algorithm not in ALGORITHMS:
            raise ScheduleError(f"sim: unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
        p = cluster.num_workers
        ring_links = [n.intra for n in cluster.nodes if len(n.devices) > 1 and n.intra is not None]
        if cluster.num_nodes > 1:
            ring_links.extend(n.nic for n in cluster.nodes)
        alpha = max((_link_alpha_s(link) for link in ring_links), default=0.0)
        bandwidth = min((link.bandwidth_bytes_per_s for link in ring_links), default=math.inf)
        if algorithm in ("ring", "tree"):
            return cls(algorithm, p, alpha, bandwidth)  # type: ignore[arg-type]
        if algorithm == "hierarchical":
            sizes = {len(n.devices) for n in cluster.nodes}
            if len(sizes) != 1:
                raise SpecError(
                    cluster.name,
                    [f"nodes: the hierarchical algorithm needs equal devices per node, got {sorted(sizes)}"],
                )
            intra = [n.intra for n in cluster.nodes if n.intra is not None]
            return cls(
                "hierarchical",
                p,
                alpha,
                bandwidth,
                nodes=cluster.num_nodes,
                per_node=sizes.pop(),
                alpha_intra_s=max((_link_alpha_s(link) for link in intra), default=0.0),
                bandwidth_intra=min((link.bandwidth_bytes_per_s for link in intra), default=math.inf),
                alpha_inter_s=max(_link_alpha_s(n.nic) for n in cluster.nodes),
                bandwidth_inter=min(n.nic.bandwidth_bytes_per_s for n in cluster.nodes),
            )
        if cluster.servers is None:
            raise SpecError(cluster.name, ["servers: the ps algorithm needs parameter servers in the cluster spec"])
        server_links = cluster.server_links
        nics = [n.nic for n in cluster.nodes]
        return cls(
            "ps",
            p,
            max(_link_alpha_s(link) for link in (*nics, *server_links)),
            min(link.bandwidth_bytes_per_s for link in nics),
            servers=cluster.servers.count,
            server_bandwidth=min(link.bandwidth_bytes_per_s for link in server_links),
        )

    # ---- phases of one collective ----

    def phases(self, kind: str, nbytes: float) -> tuple[Phase, ...]:
        """The phases of one collective of ``kind`` over ``nbytes`` bytes (per rank)."""
        p = self.world_size
        if p <= 1 or nbytes <= 0:
            return ()
        if self.algorithm == "ps":
            push = Phase(self.alpha_s, "ps_push", self._ps_transfer_s(nbytes))
            pull = Phase(self.alpha_s, "ps_pull", self._ps_transfer_s(nbytes))
            return {"all_reduce": (push, pull), "reduce_scatter": (push,), "all_gather": (pull,)}[kind]
        if self.algorithm == "hierarchical":
            return self._hierarchical(kind, nbytes)
        half = Phase((p - 1) * self.alpha_s, "ring", (p - 1) / p * nbytes / self.bandwidth)
        if kind == "all_reduce":
            if self.algorithm == "tree":
                return (Phase(2 * math.ceil(math.log2(p)) * self.alpha_s, "ring", 2 * nbytes / self.bandwidth),)
            return (Phase(2 * half.latency_s, "ring", 2 * half.work_s),)
        if kind in ("reduce_scatter", "all_gather"):
            return (half,)
        raise ScheduleError(f"sim: no cost model for task kind {kind!r}")

    def _ps_transfer_s(self, nbytes: float) -> float:
        return max(nbytes / self.bandwidth, self.world_size * nbytes / (self.servers * self.server_bandwidth))

    def _hierarchical(self, kind: str, nbytes: float) -> tuple[Phase, ...]:
        g, nodes = self.per_node, self.nodes
        intra = Phase((g - 1) * self.alpha_intra_s, "intra", (g - 1) / g * nbytes / self.bandwidth_intra)
        inter_half = Phase(
            (nodes - 1) * self.alpha_inter_s, "inter", (nodes - 1) / nodes * nbytes / self.bandwidth_inter
        )
        if kind == "all_reduce":
            inter = Phase(2 * inter_half.latency_s, "inter", 2 * inter_half.work_s)
            out: tuple[Phase, ...] = (intra, inter, intra)
        elif kind == "reduce_scatter":
            out = (intra, inter_half)
        elif kind == "all_gather":
            out = (inter_half, intra)
        else:
            raise ScheduleError(f"sim: no cost model for task kind {kind!r}")
        return tuple(ph for ph in out if ph.latency_s > 0 or ph.work_s > 0)

    def sent_bytes(self, kind: str, nbytes: float) -> float:
        """Bytes one worker sends for one collective (ring all-reduce: ``2(p-1)/p · n``; PS push: ``n``)."""
        p = self.world_size
        if p <= 1:
            return 0.0
        halves = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}[kind]
        if self.algorithm == "ps":
            return nbytes if kind != "all_gather" else 0.0
        if self.algorithm == "tree" and kind == "all_reduce":
            return 2.0 * nbytes
        if self.algorithm == "hierarchical":
            g, nodes = self.per_node, self.nodes
            return halves * ((g - 1) / g * nbytes + (nodes - 1) / nodes * nbytes / g)
        return halves * (p - 1) / p * nbytes

    def cost_s(self, kind: str, nbytes: float) -> float:
        """Time of one collective alone on the network: the sum of its phases."""
        return sum(ph.latency_s + ph.work_s for ph in self.phases(kind, nbytes))

    def transfer_s(self, kind: str, nbytes: float) -> float:
        """Bandwidth part only (what the collective occupies its links for)."""
        return sum(ph.work_s for ph in self.phases(kind, nbytes))

    def startup_s(self, kind: str) -> float:
        """Latency part only: the collective's cost for a message of zero bytes."""
        return sum(ph.latency_s for ph in self.phases(kind, 1.0))

    def first_startup_s(self, kind: str) -> float:
        """Latency before the first byte of a collective of ``kind`` can move."""
        phases = self.phases(kind, 1.0)
        return phases[0].latency_s if phases else 0.0

    def estimate(self) -> NetworkEstimate:
        """The :class:`NetworkEstimate` policies plan with: this model seen as a ring all-reduce.

        ``bandwidth`` and ``latency`` are chosen so that ``NetworkEstimate.allreduce_s``
        reproduces this model's all-reduce cost exactly (for the ring algorithm
        they are the ring's bottleneck bandwidth and per-step α).
        """
        p = self.world_size
        if p <= 1:
            finite = self.bandwidth if math.isfinite(self.bandwidth) else 1e12
            return NetworkEstimate(1, finite, 0.0)
        probe = 1 << 20
        work = self.transfer_s("all_reduce", probe)
        bandwidth = 2 * (p - 1) / p * probe / work if work > 0 else 1e12
        latency = self.startup_s("all_reduce") / (2 * (p - 1))
        return NetworkEstimate(p, bandwidth, latency)
