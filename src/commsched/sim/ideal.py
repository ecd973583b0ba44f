"""``ideal``: a lower bound on the iteration time of any lossless schedule, same cost model.

The bound is the fluid preemptive-priority schedule of ``research/prophet.md``
§5.3 (partitions → 0, no per-partition cost), generalised to any ready
order and to several tensors per layer. With the clock at the start of
backward, ``r_t`` the ready time of tensor ``t``, ``c_t`` its transfer time
(bandwidth term only) and ``S_l`` the tensors of layers ``0..l``:

    D_l = max_{t ∈ S_l} ( r_t + α₁ + Σ_{u ∈ S_l, r_u ≥ r_t} c_u )
    s_0 = max(B, D_0),   s_l = max(s_{l-1} + u_{l-1} + f_{l-1}, D_l),   T = s_{L-1} + u_{L-1} + f_{L-1}

``D_l`` is the earliest moment the gradients of layers ``0..l`` can all be
reduced: on one link, the bytes released at or after ``r_t`` cannot start
before ``r_t`` plus the startup ``α₁`` of a collective's first phase, so they
need at least ``Σ c_u`` more. Serving the lowest layers first reaches every
``D_l`` at once, and forward layer ``l`` cannot start before ``D_l`` (nor
before backward ends, ``B``). The communication of one iteration must end
before the next iteration's forward reaches the layer, so the bound holds for
the steady-state period. It implies the simpler bound ``max(F + B + c_0, Σ c)``
of §5.3 and is tighter whenever compute and transfers interleave. With
several link resources (``hierarchical``, ``ps``) each resource gives such a
bound and the largest counts, unless collectives run one at a time
(``max_concurrent=1``): then at most one resource transfers at any moment and
their work adds up. ``c_t`` takes the cheaper of one all-reduce and a
reduce-scatter plus all-gather. On a heterogeneous cluster the slowest
worker class's compute is used (same compute model and per-rank batch sizes
as :func:`~commsched.sim.simulate`).

The bound is for schedules whose tasks are priced under ``options.algorithm``.
A task on the ``"ps"`` transport is priced by the ``ps`` model whatever the
algorithm, so a plan made only of such tasks (the ``ps`` policy) is bounded
by ``ideal(..., {"algorithm": "ps"})``.

Assumptions it shares with the simulator: ready times and compute times are
fixed, compute is not slowed by communication, and every collective of the
model costs at least its bandwidth term plus ``α₁``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from commsched.cluster import Cluster
from commsched.sim.compute import PROFILE, ComputeModel, worker_classes
from commsched.sim.costs import CommModel
from commsched.sim.options import SimOptions
from commsched.workload import Workload


@dataclass(frozen=True)
class IdealResult:
    """The bound (``iteration_ms``) and what it is made of."""

    model: str
    cluster: str
    num_workers: int
    iteration_ms: float
    samples_per_s: float
    compute_ms: float
    exposed_comm_ms: float
    transfer_ms: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def fluid_priority_s(
    forward_s: list[float],
    update_s: list[float],
    backward_s: float,
    layer_of: list[int],
    ready_s: list[float],
    transfer_s: list[float],
    startup_s: float = 0.0,
) -> float:
    """The §5.3 bound for explicit per-layer and per-tensor numbers (seconds; see the module docstring)."""
    num_layers = len(forward_s)
    by_ready = sorted(range(len(ready_s)), key=lambda t: -ready_s[t])
    s_prev = -math.inf
    d_prev = -math.inf
    for layer in range(num_layers):
        best = d_prev
        if any(layer_of[t] == layer for t in by_ready):
            acc = 0.0
            best = -math.inf
            for t in by_ready:  # decreasing ready time: acc = Σ c_u over S_l with r_u >= r_t
                if layer_of[t] <= layer:
                    acc += transfer_s[t]
                    best = max(best, ready_s[t] + startup_s + acc)
        d_prev = best
        earliest = backward_s if layer == 0 else s_prev + update_s[layer - 1] + forward_s[layer - 1]
        s_prev = max(earliest, best)
    return s_prev + update_s[-1] + forward_s[-1]


def ideal(
    workload: Workload,
    cluster: Cluster,
    options: SimOptions | Mapping[str, Any] | None = None,
    *,
    compute: ComputeModel = PROFILE,
    batch_sizes: Sequence[int] | None = None,
) -> IdealResult:
    """Lower bound on the steady-state iteration time of any lossless policy (module docstring)."""
    opts = SimOptions.from_mapping(options)
    comm = CommModel.from_cluster(cluster, opts.algorithm)
    w = workload
    classes = worker_classes(cluster, w.model, batch_sizes, w.batch_size)
    timing = max((compute.timings(w, wc, opts.update_ms) for wc in classes), key=lambda t: t.compute_s)
    forward_s = list(timing.forward_s)
    update_s = list(timing.update_s)
    ready_s = list(timing.grad_ready_s)
    backward_s = timing.backward_s
    layer_of = list(w.tensor_layer)
    startup = min(comm.first_startup_s("all_reduce"), comm.first_startup_s("reduce_scatter"))

    serial = opts.max_concurrent == 1  # one collective at a time, its phases in turn: one link busy at a time

    def per_resource(nbytes: int) -> dict[str, float]:
        options = []
        for kinds in (("all_reduce",), ("reduce_scatter", "all_gather")):
            work: dict[str, float] = {}
            for kind in kinds:
                for phase in comm.phases(kind, nbytes):
                    resource = "serial" if serial else phase.resource
                    work[resource] = work.get(resource, 0.0) + phase.work_s
            options.append(work)
        one, two = options
        return {r: min(one.get(r, 0.0), two.get(r, 0.0)) for r in set(one) | set(two)}

    works = [per_resource(t.bytes) for t in w.tensors]
    resources = sorted({r for wk in works for r in wk}) or ["none"]
    best = 0.0
    transfer = 0.0
    for resource in resources:
        transfer_s = [wk.get(resource, 0.0) for wk in works]
        transfer = max(transfer, sum(transfer_s))
        bound = fluid_priority_s(forward_s, update_s, backward_s, layer_of, ready_s, transfer_s, startup)
        best = max(best, bound)
    compute_s = sum(forward_s) + sum(update_s) + backward_s
    return IdealResult(
        model=w.model,
        cluster=cluster.name,
        num_workers=cluster.num_workers,
        iteration_ms=best * 1e3,
        samples_per_s=sum(wc.batch_size * len(wc.ranks) for wc in classes) / best if best > 0 else math.inf,
        compute_ms=compute_s * 1e3,
        exposed_comm_ms=max(0.0, best - compute_s) * 1e3,
        transfer_ms=transfer * 1e3,
    )
