"""Stage cuts for one pipeline: dynamic programming over layer ranges, memory a hard constraint.

A **chain** is an ordered list of ranks that together hold the model, one
contiguous range of layers each (:class:`~commsched.schedule.stages.StageLayout`).
Costs per layer ``l`` come from the simulator's compute model
(:class:`~commsched.sim.compute.ProfileCompute`: the profiled forward and
backward times scaled by micro-batch size and device speed) and from the
memory model (:class:`~commsched.plan.memory.MemoryModel`)::

    state(l)      = P_l · (1 + g + s)                     bytes held whatever the batch
    act(l)        = a · f_l / Σ f                         activation bytes per sample
    compute(k, l) = (fwd_l + bwd_l) · m / (b_profile · speed_k)   one micro-batch of m samples

``a`` is the workload's activation memory per sample, spread over layers in
proportion to their forward time ``f_l`` (the profiles record no per-layer
activations; a first-order estimate). With 1F1B, the rank at position ``k``
of a chain of ``d`` holds the activations of at most ``min(M, d - k)``
micro-batches (Narayanan et al., PipeDream-Flush, 2021); with GPipe all ``M``.
Rank ``k`` fits layers ``[i, j)`` when ``Σ state + act · inflight_k · m``
stays within its usable memory.

:func:`best_cuts` minimises the bottleneck ``max_k c_k`` of a chain, where
``c_k`` is rank ``k``'s compute for one micro-batch plus sending its output
and receiving its gradient (``α + m · x / β`` each way; ``x``: the activation
bytes per sample of the layer before the cut, an estimate of the boundary
tensor; ``β``, ``α``: the link between the two ranks, the intra-node link when
they share a node). DP over ``(ranks placed, units covered)``, ``O(d · U²)``
for ``U`` cut units. :func:`chain_ms` is the makespan of ``M`` micro-batches,
``Σ_k c_k + (M - 1) · max_k c_k`` (GPipe's and 1F1B's alike, bubbles
included; Huang et al., NeurIPS 2019).

Cut units: the runtime runs a stage as a range of an ``nn.Sequential``'s
children, so when every layer name starts with a child index (``"3.attn"``)
cuts fall only where that index changes; otherwise (zoo profiles, which are
simulated only) at any layer boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commsched.cluster import Cluster, Link
from commsched.plan.memory import MemoryModel
from commsched.sim.compute import PROFILE, ComputeModel, WorkerClass
from commsched.workload import Workload


@dataclass(frozen=True)
class LayerCosts:
    """Per layer of a workload: persistent bytes, activation bytes per sample, compute seconds per sample at
    speed 1 (forward + backward)."""

    state_bytes: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    compute_s: tuple[float, ...]
    units: tuple[int, ...]  # the layer indices a stage may start at (0 first)

    def span(self, values: Sequence[float], i: int, j: int) -> float:
        return math.fsum(values[i:j])


def layer_costs(workload: Workload, memory: MemoryModel, compute: ComputeModel = PROFILE) -> LayerCosts:
    per_bytes = 1 + memory.gradient_copies + memory.optimizer_states
    state = tuple(layer.bytes * per_bytes for layer in workload.layers)
    a = memory.activation_bytes(workload) or 0.0
    forward = [layer.forward_ms for layer in workload.layers]
    total = math.fsum(forward)
    shares = [f / total for f in forward] if total > 0 else [1 / len(forward)] * len(forward)
    timings = compute.timings(workload, WorkerClass(0, 1.0, (0,), 1), 0.0)
    per_sample = tuple(f + b for f, b in zip(timings.forward_s, timings.backward_layer_s, strict=True))
    return LayerCosts(state, tuple(a * s for s in shares), per_sample, cut_units(workload))


def cut_units(workload: Workload) -> tuple[int, ...]:
    """Layer indices where a stage may start (module docstring)."""
    heads = [layer.name.split(".")[0] for layer in workload.layers]
    if all(h.isdigit() for h in heads):
        return tuple(i for i in range(len(heads)) if i == 0 or heads[i] != heads[i - 1])
    return tuple(range(len(heads)))


def link_between(cluster: Cluster, a: int, b: int) -> Link:
    wa, wb = cluster.workers[a], cluster.workers[b]
    if wa.node == wb.node and wa.intra is not None:
        return wa.intra
    return wa.nic if wa.nic.bandwidth_gbps <= wb.nic.bandwidth_gbps else wb.nic


def transfer_s(link: Link, nbytes: float) -> float:
    """One message of ``nbytes`` over ``link``: ``α + n / β``."""
    return (link.latency_us + link.per_message_overhead_us) * 1e-6 + nbytes / link.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Chain:
    """A chain's cuts for micro-batches of ``micro`` samples: ``starts[k]`` is rank ``k``'s first layer."""

    ranks: tuple[int, ...]
    starts: tuple[int, ...]
    micro: int
    stage_s: tuple[float, ...]  # c_k: compute + boundary transfers per micro-batch
    used_bytes: tuple[float, ...]  # memory per rank at ``micro`` (and the schedule's in-flight count)


def inflight(position: int, depth: int, micro_batches: int, schedule: str) -> int:
    """Micro-batches whose activations rank ``position`` of a chain of ``depth`` holds at once."""
    return micro_batches if schedule == "gpipe" else min(micro_batches, depth - position)


def best_cuts(
    costs: LayerCosts,
    cluster: Cluster,
    ranks: Sequence[int],
    usable_bytes: Sequence[float],
    speeds: Sequence[float],
    micro: int,
    micro_batches: int,
    schedule: str = "1f1b",
) -> Chain | None:
    """The cuts of the module docstring for ``ranks`` in that order (``usable_bytes``, ``speeds``: per rank of
    the cluster), or None when no cut fits every rank's memory."""
    d = len(ranks)
    units = [*costs.units, len(costs.state_bytes)]
    n_units = len(units) - 1
    if n_units < d:
        return None
    state = [0.0, *_prefix(costs.state_bytes)]
    act = [0.0, *_prefix(costs.activation_bytes)]
    work = [0.0, *_prefix(costs.compute_s)]

    def stage(k: int, i: int, j: int) -> float | None:
        """Rank k holding units [i, j): c_k, or None if it does not fit."""
        lo, hi = units[i], units[j]
        held = state[hi] - state[lo] + (act[hi] - act[lo]) * micro * inflight(k, d, micro_batches, schedule)
        if held > usable_bytes[ranks[k]]:
            return None
        c = (work[hi] - work[lo]) * micro / speeds[ranks[k]]
        if k + 1 < d:  # send the boundary activation, receive its gradient
            c += 2 * transfer_s(link_between(cluster, ranks[k], ranks[k + 1]), costs.activation_bytes[hi - 1] * micro)
        return c

    inf = math.inf
    best = [[inf] * (n_units + 1) for _ in range(d + 1)]
    back = [[-1] * (n_units + 1) for _ in range(d + 1)]
    best[0][0] = 0.0
    for k in range(d):
        for i in range(k, n_units - (d - k) + 1):
            if best[k][i] == inf:
                continue
            last = n_units if k == d - 1 else n_units - (d - k - 1)
            for j in range(i + 1, last + 1):
                if k == d - 1 and j != n_units:
                    continue
                c = stage(k, i, j)
                if c is None:
                    continue
                value = max(best[k][i], c)
                if value < best[k + 1][j]:
                    best[k + 1][j], back[k + 1][j] = value, i
    if best[d][n_units] == inf:
        return None
    bounds = [n_units]
    for k in range(d, 0, -1):
        bounds.append(back[k][bounds[-1]])
    bounds.reverse()
    return evaluate(
        costs,
        cluster,
        ranks,
        tuple(units[b] for b in bounds[:-1]),
        usable_bytes,
        speeds,
        micro,
        micro_batches,
        schedule,
    )


def evaluate(
    costs: LayerCosts,
    cluster: Cluster,
    ranks: Sequence[int],
    starts: tuple[int, ...],
    usable_bytes: Sequence[float],
    speeds: Sequence[float],
    micro: int,
    micro_batches: int,
    schedule: str = "1f1b",
) -> Chain | None:
    """The chain with these cuts at micro-batches of ``micro`` samples, or None if a rank's memory is exceeded."""
    d = len(ranks)
    bounds = [*starts, len(costs.state_bytes)]
    stage_s, used = [], []
    for k in range(d):
        lo, hi = bounds[k], bounds[k + 1]
        held = costs.span(costs.state_bytes, lo, hi) + costs.span(costs.activation_bytes, lo, hi) * micro * inflight(
            k, d, micro_batches, schedule
        )
        if held > usable_bytes[ranks[k]]:
            return None
        c = costs.span(costs.compute_s, lo, hi) * micro / speeds[ranks[k]]
        if k + 1 < d:
            c += 2 * transfer_s(link_between(cluster, ranks[k], ranks[k + 1]), costs.activation_bytes[hi - 1] * micro)
        stage_s.append(c)
        used.append(held)
    return Chain(tuple(ranks), starts, micro, tuple(stage_s), tuple(used))


def chain_ms(chain: Chain, micro_batches: int) -> float:
    """Makespan of ``micro_batches`` micro-batches through ``chain`` (module docstring), in ms."""
    return 1e3 * (math.fsum(chain.stage_s) + (micro_batches - 1) * max(chain.stage_s))


def _prefix(values: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out
