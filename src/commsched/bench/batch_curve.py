"""A rank's compute at several local batches, for the cluster spec's ``model_batch_ms``.

``commsched bench --plan``'s calibration times every rank's forward +
backward at a few batches, in lock-step (:func:`time_batch_curve`), and
:func:`curve_points` turns the rounds of timings into one figure per batch.
:func:`batches_around_shares` picks those batches per rank: the profile's
batch (the curves' common reference) and points around the rank's
speed-proportional share of the global batch, where a plan puts it. A curve
is followed outside its points along its end segments, and per-sample cost is
not constant (on this project's testbed a quarter-core worker's batch 7 costs
0.94 of its batch 8, where a straight line from 8 and 16 gives 0.88), so
points at the batches a plan uses beat points spread by factors of two.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from commsched.models import model_loss, synthetic_batch
from commsched.plan.batches import proportional_split

__all__ = [
    "AROUND_SHARE",
    "CURVE_REPEATS",
    "batches_around_shares",
    "curve_points",
    "proportional_share",
    "time_batch_curve",
    "time_rounds",
]

#: Timed rounds (after one untimed round).
CURVE_REPEATS = 5

#: Where a rank's curve is timed, as fractions of its speed-proportional share of the global batch.
AROUND_SHARE = (0.75, 1.0, 1.25)
#: Further fractions, taken in turn where rounding makes two of the points the same batch.
_FILL = (0.5, 1.5, 2.0, 0.25, 3.0)


def batches_around_shares(reference: int, times_ms: Sequence[float], global_batch: int) -> list[list[int]]:
    """Per rank, the local batches to time its curve at: ``reference`` and :data:`AROUND_SHARE` of its share.

    ``times_ms``: every rank's time at ``reference`` (speed ∝ 1 / time); a
    rank's share is ``global_batch · speed / Σ speed``. Every rank gets the
    same number of distinct batches (the curve is timed in lock-step, one
    barrier per batch), sorted; where rounding merges points, :data:`_FILL`'s
    fractions and then the smallest unused batches make up the count.
    """
    if reference < 1 or global_batch < 1:
        raise ValueError(f"reference and global_batch must be >= 1, got {reference} and {global_batch}")
    if not times_ms or any(not (t > 0) for t in times_ms):
        raise ValueError(f"every rank's time at the reference batch must be > 0 ms, got {list(times_ms)}")
    speeds = [1.0 / t for t in times_ms]
    count = 1 + len(AROUND_SHARE)
    out = []
    for speed in speeds:
        share = global_batch * speed / sum(speeds)
        picked = list(dict.fromkeys([reference, *(max(1, round(f * share)) for f in AROUND_SHARE)]))
        for f in _FILL:
            if len(picked) == count:
                break
            b = max(1, round(f * share))
            if b not in picked:
                picked.append(b)
        b = 1
        while len(picked) < count:
            if b not in picked:
                picked.append(b)
            b += 1
        out.append(sorted(picked))
    return out


def proportional_share(times_ms: Sequence[float], global_batch: int, rank: int) -> int:
    """Rank ``rank``'s speed-proportional share of ``global_batch`` (speed ∝ 1 / its time), as the
    speed-proportional DP baseline splits it (:func:`commsched.plan.batches.proportional_split`)."""
    if not times_ms or any(not (t > 0) for t in times_ms):
        raise ValueError(f"every rank's time must be > 0 ms, got {list(times_ms)}")
    return proportional_split(global_batch, [1.0 / t for t in times_ms])[rank]


def curve_points(times: dict[int, list[float]], reference: int) -> dict[int, float]:
    """One ms figure per batch from rounds of timings (``times[b][k]``: round k at batch b).

    The machine's speed drifts by tens of percent over a minute (seen on this project's 2-core host), so
    each batch's figure is the median over rounds of its time over ``reference``'s in the same round,
    times ``reference``'s median: the rounds' drift cancels out of the ratios. Without ``reference``
    among the batches, each batch's median.
    """
    if reference not in times:
        return {b: statistics.median(t) for b, t in times.items()}
    ref = times[reference]
    base = statistics.median(ref)
    return {b: statistics.median(x / r for x, r in zip(t, ref, strict=True)) * base for b, t in times.items()}


def time_batch_curve(
    model_name: str,
    batches: Sequence[int],
    seed: int,
    rank: int,
    model: torch.nn.Module,
    progress: Callable[[int], None] = lambda _round: None,
) -> dict[int, list[float]]:
    """Forward + backward ms of each timed round at each of ``batches`` (distinct), every rank in lock-step
    (a barrier before each iteration; every rank of the process group must call it with as many batches).

    The batches take turns (one iteration each per round), so a drift of the machine's speed over the
    measurement falls on all of them alike rather than on whichever was timed last.
    """
    if len(set(batches)) != len(batches):
        raise ValueError(f"batches: each batch once, got {list(batches)}")
    return dict(zip(batches, time_rounds(model_name, batches, seed, rank, model, progress), strict=True))


def time_rounds(
    model_name: str,
    batches: Sequence[int],
    seed: int,
    rank: int,
    model: torch.nn.Module,
    progress: Callable[[int], None] = lambda _round: None,
) -> list[list[float]]:
    """:func:`time_batch_curve`'s rounds by position in ``batches`` (a batch may come twice: ranks whose
    lists differ in values but not in length stay in lock-step)."""
    inputs = [synthetic_batch(model_name, batch, seed, rank, 0) for batch in batches]
    times: list[list[float]] = [[] for _ in batches]
    for i in range(1 + CURVE_REPEATS if batches else 0):
        for (x, y), out in zip(inputs, times, strict=True):
            dist.barrier()
            start = time.perf_counter()
            model_loss(model(x), y).backward()
            elapsed = time.perf_counter() - start
            model.zero_grad()
            if i:
                out.append(elapsed * 1e3)
        progress(i)
    return times
