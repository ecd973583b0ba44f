"""Closed-form α-β costs of collectives: pure functions, each with its formula.

Notation: ``p`` ranks, ``n`` bytes per rank (the size of the gradient piece),
``alpha_s`` the cost of one message or ring step (one-way latency plus the
per-message software overhead of the link), ``bandwidth`` in bytes/s per
direction. Reduction arithmetic (γ) is ignored: on GPUs it hides behind the
transfer. Sources: Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; NCCL's tuning model for the
tree.

Used by the policies' planning estimate (:class:`commsched.schedule.NetworkEstimate`),
the simulator's cost model (:mod:`commsched.sim.costs`) and the network probe's
α-β fit (:mod:`commsched.profile.probe_fit`): the formulas exist here only.
"""

from __future__ import annotations

import math


def ring_factors(kind: str, p: int) -> tuple[float, float]:
    """``(steps, volume)`` of a ring collective over ``p`` ranks: ``T = steps·α + volume·n / B``.

    all-reduce: ``(2(p-1), 2(p-1)/p)``; reduce-scatter and all-gather: ``(p-1, (p-1)/p)``;
    ``(0, 0)`` when ``p == 1``. The one place the ring's counts are written.
    """
    if p <= 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if kind in ("reduce_scatter", "all_gather"):
        return float(p - 1), (p - 1) / p
    raise ValueError(f"ring collective: kind must be all_reduce, reduce_scatter or all_gather, got {kind!r}")


def sent_volume(kind: str, p: int) -> float:
    """Bytes one rank sends per byte of a task over ``p`` ranks, by ring or through a server on every rank.

    Ring collectives: the ``volume`` of :func:`ring_factors`. A push or a pull
    with a server on every rank: ``(p-1)/p`` (a rank sends the other ``p - 1``
    owners their slices, or, as owner, its sum to the other ``p - 1`` ranks), the
    volume of a reduce-scatter or all-gather.
    """
    if kind in ("push", "pull"):
        return (p - 1) / p if p > 1 else 0.0
    return ring_factors(kind, p)[1]


def ring_s(kind: str, nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """A ring collective of ``n`` bytes per rank: ``steps·α + volume·n / B`` (:func:`ring_factors`)."""
    steps, volume = ring_factors(kind, p)
    return steps * alpha_s + volume * nbytes / bandwidth


def ring_all_reduce_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring all-reduce: ``2(p-1)·α + 2(p-1)/p · n / B``; 0 when ``p == 1``."""
    return ring_s("all_reduce", nbytes, p, alpha_s, bandwidth)


def ring_reduce_scatter_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring reduce-scatter of ``n`` bytes (each rank keeps ``n/p``): ``(p-1)·α + (p-1)/p · n / B``."""
    return ring_s("reduce_scatter", nbytes, p, alpha_s, bandwidth)


def ring_all_gather_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Ring all-gather to ``n`` bytes of output: ``(p-1)·α + (p-1)/p · n / B`` (same as reduce-scatter)."""
    return ring_s("all_gather", nbytes, p, alpha_s, bandwidth)


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


def ps_colocated_push_s(nbytes: float, p: int, alpha_s: float, bandwidth: float) -> float:
    """Parameter-server push of ``n`` bytes with a server on every one of the ``p`` workers (``k = p``).

    ``α + (p-1)/p · n / B``: each worker keeps its own ``1/p`` and sends the
    other ``p - 1`` servers theirs (``(p-1)/p · n`` out of its link), and, as a
    server, receives ``p - 1`` slices of ``n/p`` (``(p-1)/p · n`` into it); the
    ``p - 1`` messages leave together, so ``α`` counts once. A pull is the same
    in the other direction. ``0`` when ``p == 1``. The same bytes as a ring
    reduce-scatter, with one startup instead of ``p - 1``.
    """
    if p <= 1:
        return 0.0
    return alpha_s + (p - 1) / p * nbytes / bandwidth


def ps_push_pull_s(
    nbytes: float, workers: int, servers: int, alpha_s: float, worker_bandwidth: float, server_bandwidth: float
) -> float:
    """Push then pull: ``2α + 2·max(n / B_worker, N · n / (k · B_server))``."""
    return 2 * ps_push_s(nbytes, workers, servers, alpha_s, worker_bandwidth, server_bandwidth)
