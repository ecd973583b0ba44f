"""How the simulator maps a cluster onto the α-β costs of collectives.

The closed forms themselves are in :mod:`commsched.formulas` (notation there).

Every collective is split into :class:`Phase` objects, each a startup latency
followed by a transfer on one named link resource. The latency part does not
use bandwidth; the transfer part is ``work_s`` seconds *at the full rate of
the resource*, and concurrent transfers on one resource share it
(:mod:`commsched.sim.network`). Without contention the phases of a collective
add up exactly to those closed forms (tested).

Which phases a task becomes depends on its kind and the algorithm:
:data:`TASK_COSTS` maps ``(algorithm, task kind)`` to a :class:`TaskCost`, so
a new task kind (a parameter server's ``push``/``pull``) is one entry, not a
branch in every method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    ``ps``: push to and pull from the cluster's parameter servers (on a
    cluster that lists none: a server on every worker, ``servers_on_workers``,
    over the links a ring crosses); a reduce-scatter is a push, an all-gather
    a pull, an all-reduce both, and ``push``/``pull`` tasks are what they say.

    What each task kind costs under each algorithm is the table
    :data:`TASK_COSTS`; :func:`register_cost` adds an entry.
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
    servers_on_workers: bool = False

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
            # a server on every worker (the runtime's ps transport): the links a ring crosses, k = p
            return cls("ps", p, alpha, bandwidth, servers=p, server_bandwidth=bandwidth, servers_on_workers=True)
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

    # ---- phases of one task ----

    def phases(self, kind: str, nbytes: float) -> tuple[Phase, ...]:
        """The phases of one task of ``kind`` over ``nbytes`` bytes (per rank); see :data:`TASK_COSTS`.

        Raises ScheduleError when no cost is registered for ``kind`` under this algorithm.
        """
        cost = self._cost(kind)
        if self.world_size <= 1 or nbytes <= 0:
            return ()
        return cost.phases(self, nbytes)

    def sent_bytes(self, kind: str, nbytes: float) -> float:
        """Bytes one worker sends for one task (ring all-reduce: ``2(p-1)/p · n``; PS push: ``n``)."""
        cost = self._cost(kind)
        if self.world_size <= 1:
            return 0.0
        return cost.sent_bytes(self, nbytes)

    def _cost(self, kind: str) -> TaskCost:
        cost = TASK_COSTS.get((self.algorithm, kind))
        if cost is None:
            known = ", ".join(k for (a, k) in TASK_COSTS if a == self.algorithm)
            raise ScheduleError(
                f"sim: no cost model for task kind {kind!r} under algorithm {self.algorithm!r}; known: {known}"
            )
        return cost

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


# ---- the cost of each task kind under each algorithm ----


@dataclass(frozen=True, slots=True)
class TaskCost:
    """How one task kind costs under one algorithm, for ``p > 1`` ranks and ``n > 0`` bytes.

    ``phases(model, n)``: what the network executes. ``sent_bytes(model, n)``:
    bytes one worker sends (reported as ``sent_bytes_per_worker``).
    """

    phases: Callable[[CommModel, float], tuple[Phase, ...]]
    sent_bytes: Callable[[CommModel, float], float]


_HALVES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


def _ring(kind: str) -> TaskCost:
    """One flat ring over all ranks (:func:`commsched.formulas.ring_factors`)."""
    halves = _HALVES[kind]

    def phases(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
        steps, volume = ring_factors(kind, m.world_size)
        return (Phase(steps * m.alpha_s, "ring", volume * nbytes / m.bandwidth),)

    def sent_bytes(m: CommModel, nbytes: float) -> float:
        p = m.world_size
        return halves * (p - 1) / p * nbytes

    return TaskCost(phases, sent_bytes)


def _tree_all_reduce(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
    """NCCL's double binary tree: ``2·⌈log2 p⌉·α + 2·n/B``."""
    return (Phase(2 * math.ceil(math.log2(m.world_size)) * m.alpha_s, "ring", 2 * nbytes / m.bandwidth),)


def _hierarchical(kind: str) -> TaskCost:
    """Intra-node ring, inter-node ring over nodes, intra-node ring (the parts ``kind`` needs)."""
    halves = _HALVES[kind]

    def phases(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
        steps, volume = ring_factors("reduce_scatter", m.per_node)
        intra = Phase(steps * m.alpha_intra_s, "intra", volume * nbytes / m.bandwidth_intra)
        steps, volume = ring_factors("reduce_scatter", m.nodes)
        inter_half = Phase(steps * m.alpha_inter_s, "inter", volume * nbytes / m.bandwidth_inter)
        if kind == "all_reduce":
            inter = Phase(2 * inter_half.latency_s, "inter", 2 * inter_half.work_s)
            out: tuple[Phase, ...] = (intra, inter, intra)
        elif kind == "reduce_scatter":
            out = (intra, inter_half)
        else:
            out = (inter_half, intra)
        return tuple(ph for ph in out if ph.latency_s > 0 or ph.work_s > 0)

    def sent_bytes(m: CommModel, nbytes: float) -> float:
        g, nodes = m.per_node, m.nodes
        return halves * ((g - 1) / g * nbytes + (nodes - 1) / nodes * nbytes / g)

    return TaskCost(phases, sent_bytes)


def _ps_transfer_s(m: CommModel, nbytes: float) -> float:
    """The bandwidth part of one push (or pull) of ``n`` bytes by each of ``N`` workers.

    The cluster's ``k`` servers: ``max(n / B_worker, N · n / (k · B_server))``
    (:func:`commsched.formulas.ps_push_s`). A server on every worker (``k = N``,
    ``servers_on_workers``): ``(N-1)/N · n / B``, each worker's own slice staying
    local (:func:`commsched.formulas.ps_colocated_push_s`).
    """
    if m.servers_on_workers:
        return (m.world_size - 1) / m.world_size * nbytes / m.bandwidth
    return max(nbytes / m.bandwidth, m.world_size * nbytes / (m.servers * m.server_bandwidth))


def _ps_push(m: CommModel, nbytes: float) -> Phase:
    """Worker uplinks into server downlinks; a server on every worker loads the ring's links both ways."""
    return Phase(m.alpha_s, "ring" if m.servers_on_workers else "ps_push", _ps_transfer_s(m, nbytes))


def _ps_pull(m: CommModel, nbytes: float) -> Phase:
    """Server uplinks into worker downlinks (a push and a pull of dedicated servers use opposite directions)."""
    return Phase(m.alpha_s, "ring" if m.servers_on_workers else "ps_pull", _ps_transfer_s(m, nbytes))


def _tree_sent_bytes(m: CommModel, nbytes: float) -> float:
    return 2.0 * nbytes


def _ps_push_pull(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
    return (_ps_push(m, nbytes), _ps_pull(m, nbytes))


def _ps_push_only(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
    return (_ps_push(m, nbytes),)


def _ps_pull_only(m: CommModel, nbytes: float) -> tuple[Phase, ...]:
    return (_ps_pull(m, nbytes),)


def _sends_all(m: CommModel, nbytes: float) -> float:
    """A worker pushes all ``n`` bytes (all but its own ``1/N`` when it is a server too)."""
    return (m.world_size - 1) / m.world_size * nbytes if m.servers_on_workers else nbytes


def _sends_nothing(m: CommModel, nbytes: float) -> float:
    """A worker only receives a pull (a worker that is a server too sends its ``1/N`` to the others)."""
    return (m.world_size - 1) / m.world_size * nbytes if m.servers_on_workers else 0.0


def _sends_twice(m: CommModel, nbytes: float) -> float:
    """A push and a pull by one task (a PS all-reduce)."""
    return _sends_all(m, nbytes) + _sends_nothing(m, nbytes)


#: ``(algorithm, task kind) -> TaskCost``. Giving an algorithm a task kind is one :func:`register_cost` call.
TASK_COSTS: dict[tuple[str, str], TaskCost] = {
    ("ring", "all_reduce"): _ring("all_reduce"),
    ("ring", "reduce_scatter"): _ring("reduce_scatter"),
    ("ring", "all_gather"): _ring("all_gather"),
    ("tree", "all_reduce"): TaskCost(_tree_all_reduce, _tree_sent_bytes),
    ("tree", "reduce_scatter"): _ring("reduce_scatter"),  # NCCL has no tree for these
    ("tree", "all_gather"): _ring("all_gather"),
    ("hierarchical", "all_reduce"): _hierarchical("all_reduce"),
    ("hierarchical", "reduce_scatter"): _hierarchical("reduce_scatter"),
    ("hierarchical", "all_gather"): _hierarchical("all_gather"),
    # a parameter server: a reduce-scatter is a push, an all-gather a pull, an all-reduce both
    ("ps", "all_reduce"): TaskCost(_ps_push_pull, _sends_twice),
    ("ps", "reduce_scatter"): TaskCost(_ps_push_only, _sends_all),
    ("ps", "all_gather"): TaskCost(_ps_pull_only, _sends_nothing),
    ("ps", "push"): TaskCost(_ps_push_only, _sends_all),
    ("ps", "pull"): TaskCost(_ps_pull_only, _sends_nothing),
}


def register_cost(
    algorithm: str,
    kind: str,
    phases: Callable[[CommModel, float], tuple[Phase, ...]],
    sent_bytes: Callable[[CommModel, float], float],
) -> None:
    """Make ``kind`` tasks cost ``phases`` under ``algorithm`` (replacing any earlier registration)."""
    TASK_COSTS[(algorithm, kind)] = TaskCost(phases, sent_bytes)
