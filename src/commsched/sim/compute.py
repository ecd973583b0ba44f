"""How long a worker computes: the simulator's compute model, one timing per worker class.

Ranks with the same compute speed and the same batch size behave identically,
so the simulator keeps one timeline per :class:`WorkerClass` and asks a
:class:`ComputeModel` for that class's :class:`ClassCompute`: forward time per
layer, backward duration, gradient-ready offsets, per-layer update time and
the total. The default, :class:`ProfileCompute`, scales the workload's
profiled (or FLOP-estimated) times::

    t = t_profile · (b / b_profile) / speed

``speed`` is the device's speed relative to the profiled device (its
per-model override where the cluster spec has one), ``b`` the rank's batch
size and ``b_profile`` the workload's. Linear in batch size is a first-order
model: it ignores that small batches use a device less efficiently, so it
overestimates the saving of a smaller batch. Where the cluster spec gives a
device measured times at several batches (``model_batch_ms``), ``b /
b_profile`` is replaced by ``T(b) / T(b_profile)``, ``T`` the piecewise-linear
curve through those points (:func:`batch_factor`): on this project's CPU
testbed a worker at a quarter of a core takes 7 % longer per sample at batch
8 than at 16, and a whole core 9 % less per sample at 33.

Another model plugs in through ``simulate(..., compute=...)``: anything with a
``timings(workload, worker, update_ms)`` method, e.g. one that charges
communication's CPU work to compute or reads measured per-rank profiles.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from commsched.cluster import BatchCurve, Cluster
from commsched.errors import ScheduleError
from commsched.workload import Workload


@dataclass(frozen=True)
class WorkerClass:
    """Ranks that share one simulated timeline (same compute speed, batch size, batch curve and overlap costs)."""

    index: int
    speed: float
    ranks: tuple[int, ...]
    batch_size: int
    curve: BatchCurve = ()
    overlap_ms_per_mb: float | None = None  # the device's measured cost of communicating beside compute
    overlap_ms_per_task: float | None = None  # the same per task started beside compute
    overlap_comm_rate: float | None = None  # the share of its rate a collective keeps while the device computes

    @property
    def rank(self) -> int:
        """The representative rank (the lowest), used as ``worker`` in the trace."""
        return self.ranks[0]


def worker_classes(
    cluster: Cluster, model: str | None = None, batch_sizes: Sequence[int] | None = None, default_batch: int = 1
) -> tuple[WorkerClass, ...]:
    """Group ranks by (compute speed, batch size, batch curve, overlap costs and comm rate); rank 0's class (the
    leader) first.

    ``batch_sizes``: one per rank; ``None`` gives every rank ``default_batch``
    (the workload's batch size). Raises ScheduleError when the count does not
    match the cluster or a batch size is not a positive integer.
    """
    speeds = cluster.worker_speeds(model)
    batches = check_batch_sizes(batch_sizes, len(speeds)) if batch_sizes is not None else (default_batch,) * len(speeds)
    curves = cluster.worker_batch_curves(model)
    per_mb, per_task = cluster.worker_overlap_ms_per_mb(), cluster.worker_overlap_ms_per_task()
    rates = cluster.worker_overlap_comm_rate()
    by_key: dict[tuple[float, int, BatchCurve, float | None, float | None, float | None], list[int]] = {}
    for rank, key in enumerate(zip(speeds, batches, curves, per_mb, per_task, rates, strict=True)):
        by_key.setdefault(key, []).append(rank)
    return tuple(
        WorkerClass(i, speed, tuple(ranks), batch, curve, mb, task, rate)
        for i, ((speed, batch, curve, mb, task, rate), ranks) in enumerate(by_key.items())
    )


def batch_factor(curve: BatchCurve, batch: int, profile_batch: int) -> float:
    """Compute time at ``batch`` over that at ``profile_batch``: ``batch / profile_batch`` without a curve,
    else ``T(batch) / T(profile_batch)``, ``T`` piecewise linear through the curve's points and extended
    along its first and last segments (where that reaches 0 or below, in proportion from the first point)."""
    if batch == profile_batch:
        return 1.0
    if not curve:
        return batch / profile_batch
    return _along(curve, batch) / _along(curve, profile_batch)


def _along(curve: BatchCurve, batch: int) -> float:
    segments = list(itertools.pairwise(curve))
    # the segment holding batch, or the end one nearest it
    (b0, t0), (b1, t1) = next((seg for seg in segments if batch <= seg[1][0]), segments[-1])
    t = t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    return t if t > 0 else curve[0][1] * batch / curve[0][0]


def check_batch_sizes(batch_sizes: Sequence[int], workers: int) -> tuple[int, ...]:
    """``batch_sizes`` as a tuple, or ScheduleError saying what is wrong with it."""
    out = tuple(batch_sizes)
    if len(out) != workers:
        raise ScheduleError(f"sim: batch_sizes has {len(out)} entries, the cluster has {workers} workers")
    for rank, batch in enumerate(out):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ScheduleError(f"sim: batch_sizes[{rank}] must be an integer >= 1, got {batch!r}")
    return out


@dataclass(frozen=True)
class ClassCompute:
    """What one worker class computes per iteration, in seconds.

    ``forward_s[l]``: forward of layer ``l``. ``backward_s``: the whole
    backward pass (at least the last gradient-ready offset).
    ``grad_ready_s[t]``: tensor ``t``'s gradient is ready this long after
    backward starts. ``backward_layer_s[l]``: backward of layer ``l`` (layers
    run last to first; used for the trace). ``update_s[l]``: the optimizer
    update of layer ``l``. ``compute_s``: forward + backward + update (what
    ``gpu_busy`` and ``exposed_comm_ms`` are measured against).
    """

    forward_s: tuple[float, ...]
    backward_s: float
    grad_ready_s: tuple[float, ...]
    backward_layer_s: tuple[float, ...]
    update_s: tuple[float, ...]
    compute_s: float


class ComputeModel(Protocol):
    """The simulator's question to a compute model: how long does this worker class compute?"""

    def timings(self, workload: Workload, worker: WorkerClass, update_ms: float) -> ClassCompute:
        """Timings of one class; ``update_ms`` is the optimizer time per iteration on the profiled device."""
        ...


class ProfileCompute:
    """The workload's per-layer times scaled by speed and batch size (module docstring).

    The update time ``update_ms`` is spread over layers in proportion to their
    bytes; everything is divided by ``speed`` and multiplied by
    ``batch_size / workload.batch_size``.
    """

    __slots__ = ()

    def timings(self, workload: Workload, worker: WorkerClass, update_ms: float) -> ClassCompute:
        w = workload
        scale = 1e-3 / worker.speed * batch_factor(worker.curve, worker.batch_size, w.batch_size)
        ready_ms = w.grad_ready_ms
        backward_ms = max(w.backward_ms, max(ready_ms))
        layer_bytes = [layer.bytes for layer in w.layers]
        total_bytes = sum(layer_bytes)
        return ClassCompute(
            forward_s=tuple(layer.forward_ms * scale for layer in w.layers),
            backward_s=backward_ms * scale,
            grad_ready_s=tuple(r * scale for r in ready_ms),
            backward_layer_s=tuple(layer.backward_ms * scale for layer in w.layers),
            update_s=tuple(update_ms * b / total_bytes * scale for b in layer_bytes),
            compute_s=(w.forward_ms + backward_ms + update_ms) * scale,
        )


#: The default compute model.
PROFILE = ProfileCompute()
