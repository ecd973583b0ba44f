"""What one simulated run predicts, :class:`SimResult`, measured from the finished run by :func:`measure`.

Iteration ``k`` lasts from its forward start to the next one on the leader
(rank 0); the steady state is the ``iterations`` iterations after the
``warmup`` ones, and the reported iteration time is the median of theirs.
Times are per iteration unless named otherwise; the trace and the plan ride
along for plots and for ``parallelize``, but stay out of
:meth:`SimResult.to_dict`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from statistics import median
from typing import Any

from commsched.cluster import Cluster
from commsched.schedule import CommPlan
from commsched.sim.compute import WorkerClass
from commsched.sim.network import LinkUsage
from commsched.sim.options import SimOptions
from commsched.trace import Trace


@dataclass(frozen=True)
class SimResult:
    """What one simulated run predicts. Times are per iteration unless named otherwise.

    ``iteration_ms``: median over the steady-state iterations (leader's
    forward start to forward start). ``samples_per_s``: the batch sizes of
    all ranks / iteration. ``gpu_busy``: compute time / iteration time, averaged over
    workers. ``link_utilisation``: per link resource, the fraction of the
    steady-state window during which it carried data. ``exposed_comm_ms``:
    iteration time minus the compute time of the slowest worker (what
    communication adds to the critical path). ``gradient_bytes``: gradient
    bytes reduced per iteration (an RS+AG pair counts once).
    ``sent_bytes_per_worker``: bytes each worker sends per iteration under the
    cost model. ``events``: event-loop events processed.
    """

    policy: str
    model: str
    cluster: str
    num_workers: int
    iterations: int
    warmup: int
    iteration_ms: float
    iteration_ms_each: tuple[float, ...]
    samples_per_s: float
    compute_ms: float
    gpu_busy: float
    gpu_busy_by_class: tuple[float, ...]
    link_utilisation: dict[str, float]
    exposed_comm_ms: float
    gradient_bytes: float
    sent_bytes_per_worker: float
    num_tasks: int
    events: int
    wall_s: float
    knobs: dict[str, Any]
    options: SimOptions
    classes: tuple[WorkerClass, ...]
    trace: Trace | None = field(default=None, repr=False, compare=False)
    #: The plan that was simulated: ``result.plan.save(path)`` writes a plan file ``parallelize`` runs.
    plan: CommPlan | None = field(default=None, repr=False, compare=False)
    #: Why this prediction is not to be trusted as the others are (None: nothing known against it).
    unvalidated: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, without the trace and the plan."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("trace", "plan")}
        out["options"] = asdict(self.options)
        out["classes"] = [
            {"speed": c.speed, "batch_size": c.batch_size, "workers": len(c.ranks), "first_rank": c.rank}
            for c in self.classes
        ]
        out["iteration_ms_each"] = list(self.iteration_ms_each)
        out["gpu_busy_by_class"] = list(self.gpu_busy_by_class)
        return out


def measure(
    plan: CommPlan,
    model: str,
    cluster: Cluster,
    options: SimOptions,
    classes: tuple[WorkerClass, ...],
    *,
    starts_s: Sequence[float],
    warmup: int,
    iterations: int,
    compute_s: Sequence[float],
    links: Mapping[str, LinkUsage],
    reduced_bytes: float,
    sent_bytes: float,
    events: int,
    trace: Trace | None,
    knobs: Mapping[str, Any],
    wall_s: float,
) -> SimResult:
    """What a finished run of ``plan`` predicts; fills ``trace``'s meta.

    ``starts_s``: the leader's forward starts, ``warmup + iterations + 1`` of
    them (the last is the forward that consumes the last update).
    ``compute_s``: each worker class's compute per iteration. ``links``: the
    network model's link resources. ``reduced_bytes``, ``sent_bytes``: what
    the steady-state iterations reduced and each worker sent, in all.
    ``events``: event-loop events processed.
    """
    total = warmup + iterations
    periods = [b - a for a, b in itertools.pairwise(starts_s)]
    steady = periods[warmup:total]
    iteration_s = median(steady)
    window = (starts_s[warmup], starts_s[total])
    span = window[1] - window[0]
    mean_period = span / iterations
    counts = [len(wc.ranks) for wc in classes]
    busy = tuple(min(1.0, cs / mean_period) if mean_period > 0 else 1.0 for cs in compute_s)
    gpu_busy = sum(b * n for b, n in zip(busy, counts, strict=True)) / sum(counts)
    slowest = max(compute_s)
    util = {name: (link.busy_within(*window) / span if span > 0 else 0.0) for name, link in sorted(links.items())}
    num_workers = cluster.num_workers
    samples = sum(wc.batch_size * len(wc.ranks) for wc in classes)
    if trace is not None:
        trace.meta.update(
            {
                "source": "simulated",
                "policy": plan.policy,
                "model": model,
                "cluster": cluster.name,
                "num_workers": num_workers,
                "update": plan.update,
                "options": asdict(options),
                "knobs": dict(knobs),
                "classes": [
                    {"rank": wc.rank, "workers": len(wc.ranks), "speed": wc.speed, "batch_size": wc.batch_size}
                    for wc in classes
                ],
                "iteration_starts_s": list(starts_s),
            }
        )
    return SimResult(
        policy=plan.policy,
        model=model,
        cluster=cluster.name,
        num_workers=num_workers,
        iterations=iterations,
        warmup=warmup,
        iteration_ms=iteration_s * 1e3,
        iteration_ms_each=tuple(p * 1e3 for p in steady),
        samples_per_s=samples / iteration_s if iteration_s > 0 else math.inf,
        compute_ms=slowest * 1e3,
        gpu_busy=gpu_busy,
        gpu_busy_by_class=busy,
        link_utilisation=util,
        exposed_comm_ms=max(0.0, iteration_s - slowest) * 1e3,
        gradient_bytes=reduced_bytes / iterations,
        sent_bytes_per_worker=sent_bytes / iterations,
        num_tasks=len(plan.tasks),
        events=events,
        wall_s=wall_s,
        knobs=dict(knobs),
        options=options,
        classes=classes,
        trace=trace,
        plan=plan,
        unvalidated=unvalidated(plan, options),
    )


def unvalidated(plan: CommPlan, options: SimOptions) -> str | None:
    """Why a prediction of ``plan`` under ``options`` is not to be trusted as the others are (None: nothing known)."""
    if options.network == "flow" and not plan.lossless:
        return (
            "bounded-loss tasks priced as lossless transfers: the flow-level network has no "
            "retransmission or incast tail for a bounded-loss transport to cut"
        )
    return None
