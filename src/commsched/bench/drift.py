"""The host's compute speed while a session runs, against the calibration's: predictions at the runs' speed.

On a shared or virtual host the speed of compute drifts by tens of percent
over minutes. On this project's 2-core host rank 0's forward + backward at
batch 16 took 541 ms in one calibration and 580-649 ms in the seven before
it, and the session after that calibration ran the plan's compute alone
25 % slower than the simulator, working from the calibration, predicted. A
prediction made minutes before the runs is then off by the host's drift,
whatever the simulator's quality.

So every repeat of ``commsched bench --plan`` starts with every rank timing
its forward + backward at the calibration's reference batch, in lock-step, as
the calibration did (:func:`time_reference`). A rank's **speed factor** in
that repeat is its median time there over the calibration's
(:func:`speed_factors`); the host simulates every configuration again with
each rank's compute scaled by its factor (:meth:`MeasuredSpec.rescaled`) and
sets the median over repeats beside the calibration's prediction
(:func:`commsched.bench.hetero.predictions_at_run_speed`). That prediction
uses the runs' compute speed, timed alone, and nothing of the
configurations' own timings: the reference, like the calibration, runs no
communication.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from commsched.bench.batch_curve import time_batch_curve

__all__ = ["speed_factors", "time_reference"]


def time_reference(
    model_name: str,
    batch: int,
    seed: int,
    rank: int,
    model: torch.nn.Module,
    progress: Callable[[int], None] = lambda _round: None,
) -> list[float]:
    """This rank's forward + backward ms per timed round at ``batch``, every rank in lock-step (all call it)."""
    return time_batch_curve(model_name, [batch], seed, rank, model, progress)[batch]


def speed_factors(
    references: Sequence[Sequence[Mapping[str, Any]]], calibrated_ms: Sequence[float]
) -> list[list[float]]:
    """Per repeat, per rank: the median of the rank's reference rounds over its calibrated time.

    ``references[r]``: rank r's records, ``{"repeat": k, "ms": [...]}`` per
    repeat; ``calibrated_ms[r]``: its forward + backward at the same batch in
    the calibration. Raises ValueError naming the rank and repeat where a
    record is missing or holds no positive time.
    """
    if len(references) != len(calibrated_ms):
        raise ValueError(f"references: {len(references)} ranks for {len(calibrated_ms)} calibrated times")
    for r, ms in enumerate(calibrated_ms):
        if not ms > 0:
            raise ValueError(f"calibrated_ms[{r}]: must be > 0, got {ms!r}")
    repeats = sorted({int(rec["repeat"]) for recs in references for rec in recs})
    out = []
    for k in repeats:
        row = []
        for r, recs in enumerate(references):
            times = [rec["ms"] for rec in recs if int(rec["repeat"]) == k]
            if len(times) != 1 or not times[0] or any(not t > 0 for t in times[0]):
                raise ValueError(f"references[{r}]: repeat {k} needs one record of times > 0 ms, got {times!r}")
            row.append(statistics.median(times[0]) / calibrated_ms[r])
        out.append(row)
    return out
