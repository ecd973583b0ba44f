"""How the simulator maps a cluster onto the α-β costs of collectives.

The closed forms themselves are in :mod:`commsched.formulas` (notation there).

Every collective is split into :class:`Phase` objects, each a startup latency
followed by a transfer on one named link resource. The latency part does not
use bandwidth; the transfer part is ``work_s`` seconds *at the full rate of
the resource*, and concurrent transfers on one resource share it
(:mod:`commsched.sim.network`). Without contention the phases of a collective
add up exactly to those closed forms (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from commsched.cluster import Cluster, Link
from commsched.errors import ScheduleError, SpecError
from commsched.formulas import ring_factors
from commsched.schedule.base import NetworkEstimate

Algorithm = Literal["ring", "tree", "hierarchical", "ps"]
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "hierarchical", "ps")


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
        if kind == "all_reduce" and self.algorithm == "tree":
            return (Phase(2 * math.ceil(math.log2(p)) * self.alpha_s, "ring", 2 * nbytes / self.bandwidth),)
        if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
            raise ScheduleError(f"sim: no cost model for task kind {kind!r}")
        steps, volume = ring_factors(kind, p)
        return (Phase(steps * self.alpha_s, "ring", volume * nbytes / self.bandwidth),)

    def _ps_transfer_s(self, nbytes: float) -> float:
        return max(nbytes / self.bandwidth, self.world_size * nbytes / (self.servers * self.server_bandwidth))

    def _hierarchical(self, kind: str, nbytes: float) -> tuple[Phase, ...]:
        g, nodes = self.per_node, self.nodes
        steps, volume = ring_factors("reduce_scatter", g)
        intra = Phase(steps * self.alpha_intra_s, "intra", volume * nbytes / self.bandwidth_intra)
        steps, volume = ring_factors("reduce_scatter", nodes)
        inter_half = Phase(steps * self.alpha_inter_s, "inter", volume * nbytes / self.bandwidth_inter)
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
