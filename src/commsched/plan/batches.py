"""Splitting a global batch over ranks of different speeds (and memory).

``even_split`` (plain data parallelism), ``proportional_split`` (shares ∝ measured
samples/s, largest-remainder rounding), ``balanced_split`` (every rank's compute
ends together under the simulator's compute model, within memory caps) and
``blend`` between two splits; ``rank_compute_fn`` is the per-rank compute time
those searches balance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache

from commsched.cluster import BatchCurve, Cluster
from commsched.plan.memory import InfeasibleError, OutOfMemoryError
from commsched.sim.compute import PROFILE, ComputeModel, ProfileCompute, WorkerClass, batch_factor
from commsched.workload import Workload


def rank_compute_fn(
    workload: Workload, cluster: Cluster, compute: ComputeModel = PROFILE, update_ms: float = 0.0
) -> Callable[[int, int], float]:
    """``t(rank, b)``: seconds of forward + backward + update of ``rank`` at local batch ``b`` (memoised by speed).

    Under the profile compute model time is the profile's scaled by :func:`~commsched.sim.compute.batch_factor`
    (:class:`~commsched.sim.compute.ProfileCompute`), so each speed's time is computed once, at the profile's
    batch, and scaled: the bisection of :func:`balanced_split` asks for hundreds of batches, and a full
    per-layer timing each cost a second at 16 ranks.
    """
    speeds = cluster.worker_speeds(workload.model)
    curves = cluster.worker_batch_curves(workload.model)

    @cache
    def by_speed(speed: float, batch: int, curve: BatchCurve) -> float:
        return compute.timings(workload, WorkerClass(0, speed, (0,), batch, curve), update_ms).compute_s

    if isinstance(compute, ProfileCompute):
        b0 = workload.batch_size
        return lambda rank, batch: by_speed(speeds[rank], b0, ()) * batch_factor(curves[rank], batch, b0)
    return lambda rank, batch: by_speed(speeds[rank], batch, curves[rank])


def even_split(global_batch: int, workers: int) -> tuple[int, ...]:
    """``B // n`` each, the remainder one each to the first ranks."""
    base, extra = divmod(global_batch, workers)
    return tuple(base + (1 if r < extra else 0) for r in range(workers))


def proportional_split(global_batch: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Shares ∝ ``weights`` with largest-remainder rounding (Hamilton), each at least 1; sums to ``global_batch``.

    A rank whose share rounds to 0 gets 1, taken from the ranks furthest above their exact shares.
    """
    n = len(weights)
    if global_batch < n:
        raise InfeasibleError(f"plan: global batch {global_batch} is smaller than the {n} ranks")
    total = sum(weights)
    exact = [global_batch * w / total for w in weights]
    out = [max(1, math.floor(x)) for x in exact]
    left = global_batch - sum(out)
    if left > 0:  # the largest remainders, among the ranks not raised to 1
        rounded = [r for r in range(n) if out[r] == math.floor(exact[r])]
        for r in sorted(rounded, key=lambda r: (-(exact[r] - math.floor(exact[r])), r))[:left]:
            out[r] += 1
    for _ in range(-left):
        r = max((r for r in range(n) if out[r] > 1), key=lambda r: (out[r] - exact[r], -r))
        out[r] -= 1
    return tuple(out)


def balanced_split(
    global_batch: int, caps: Sequence[int], compute_s: Callable[[int, int], float], workers: int
) -> tuple[int, ...]:
    """Integer ``b`` with ``Σ b = B``, ``1 ≤ b_i ≤ caps[i]``, minimising ``max_i compute_s(i, b_i)`` (module docstring).

    ``compute_s(rank, b)`` must be non-decreasing in ``b``. Raises InfeasibleError
    when ``B`` exceeds the sum of the caps or is smaller than the number of ranks.
    """
    caps = [min(c, global_batch) for c in caps]
    if global_batch < workers:
        raise InfeasibleError(f"plan: global batch {global_batch} is smaller than the {workers} ranks")
    if sum(caps) < global_batch:
        raise OutOfMemoryError(
            f"plan: global batch {global_batch} does not fit: the devices hold at most {sum(caps)} samples "
            f"together (short by {global_batch - sum(caps)})"
        )

    def batch_within(rank: int, t: float) -> int:
        lo, hi = 1, caps[rank]  # largest b in [1, cap] with compute_s(rank, b) <= t (1 if none)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if compute_s(rank, mid) <= t:
                lo = mid
            else:
                hi = mid - 1
        return lo

    t_lo = max(compute_s(r, 1) for r in range(workers))
    t_hi = max(compute_s(r, caps[r]) for r in range(workers))
    for _ in range(100):
        if t_hi - t_lo <= 1e-12 * max(1.0, t_hi):
            break
        mid = (t_lo + t_hi) / 2
        if sum(batch_within(r, mid) for r in range(workers)) >= global_batch:
            t_hi = mid
        else:
            t_lo = mid
    split = [batch_within(r, t_hi) for r in range(workers)]
    surplus = sum(split) - global_batch
    while surplus > 0:  # take from the rank that finishes last (and can give one up)
        r = max((r for r in range(workers) if split[r] > 1), key=lambda r: (compute_s(r, split[r]), r))
        split[r] -= 1
        surplus -= 1
    return tuple(split)


def micro_units(
    global_batch: int, caps: Sequence[int], micro_batch: int | None, cluster: Cluster
) -> tuple[int, tuple[int, ...]]:
    """The unit batches are split in (the micro-batch, or 1) and each rank's cap in units.

    With micro-batches a rank holds one micro-batch's activations at a time, so
    its batch is capped only by the global batch; InfeasibleError when the global
    batch is not a whole number of micro-batches or a rank cannot hold one.
    """
    if micro_batch is None:
        return 1, tuple(caps)
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise InfeasibleError(f"plan: micro_batch must be a whole number >= 1, got {micro_batch!r}")
    if global_batch % micro_batch:
        raise InfeasibleError(f"plan: global batch {global_batch} is not a multiple of micro_batch {micro_batch}")
    for w, cap in zip(cluster.workers, caps, strict=True):
        if cap < micro_batch:
            raise OutOfMemoryError(
                f"plan: rank {w.rank} ({w.device.name} on node {w.node_name}) holds {cap} sample(s), "
                f"less than one micro-batch of {micro_batch}"
            )
    units = global_batch // micro_batch
    return micro_batch, (units,) * len(caps)


def blend(a: Sequence[int], b: Sequence[int], weight: float, global_batch: int) -> tuple[int, ...]:
    """``(1 - weight)·a + weight·b``, rounded by largest remainder to sum to ``global_batch``."""
    return proportional_split(
        global_batch, [max(1e-9, (1 - weight) * x + weight * y) for x, y in zip(a, b, strict=True)]
    )


def candidate_splits(
    global_batch: int,
    caps: Sequence[int],
    compute_s: Callable[[int, int], float],
    speeds: Sequence[float],
    micro_batch: int | None,
    cluster: Cluster,
) -> tuple[tuple[int, ...], dict[tuple[int, ...], str], tuple[int, ...], tuple[int, ...]]:
    """The per-rank caps in samples (:func:`micro_units`), the candidate splits by name (balanced,
    speed-proportional, even, and blends of balanced and even), the even and the proportional split; with
    ``micro_batch``, every batch a multiple of it."""
    unit, unit_caps = micro_units(global_batch, caps, micro_batch, cluster)
    n, units = len(caps), global_batch // unit

    def in_samples(split: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(b * unit for b in split)

    balanced = balanced_split(units, unit_caps, lambda r, k: compute_s(r, k * unit), n)
    splits: dict[tuple[int, ...], str] = {}
    named = (
        ("balanced", balanced),
        ("proportional", proportional_split(units, speeds)),
        ("even", even_split(units, n)),
    )
    for name, split in named:
        splits.setdefault(in_samples(split), name)
    for weight in (0.25, 0.5, 0.75):
        splits.setdefault(in_samples(blend(balanced, even_split(units, n), weight, units)), f"balanced-even {weight:g}")
    even, proportional = in_samples(named[2][1]), in_samples(named[1][1])
    return tuple(c * unit for c in unit_caps), splits, even, proportional


# ---- results ----
