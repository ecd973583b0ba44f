"""A rank's compute at several local batches, for the cluster spec's ``model_batch_ms``.

``commsched bench --plan``'s calibration times every rank's forward +
backward at a few batches, in lock-step (:func:`time_batch_curve`), and
:func:`curve_points` turns the rounds of timings into one figure per batch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from commsched.models import model_loss, synthetic_batch

__all__ = ["CURVE_REPEATS", "curve_points", "time_batch_curve"]

#: Timed rounds (after one untimed round).
CURVE_REPEATS = 5


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
    """Forward + backward ms of each timed round at each of ``batches``, every rank in lock-step (a barrier
    before each iteration; every rank of the process group must call it with the same ``batches``).

    The batches take turns (one iteration each per round), so a drift of the machine's speed over the
    measurement falls on all of them alike rather than on whichever was timed last.
    """
    if not batches:
        return {}
    inputs = {batch: synthetic_batch(model_name, batch, seed, rank, 0) for batch in batches}
    times: dict[int, list[float]] = {batch: [] for batch in batches}
    for i in range(1 + CURVE_REPEATS):
        for batch, (x, y) in inputs.items():
            dist.barrier()
            start = time.perf_counter()
            model_loss(model(x), y).backward()
            elapsed = time.perf_counter() - start
            model.zero_grad()
            if i:
                times[batch].append(elapsed * 1e3)
        progress(i)
    return times
