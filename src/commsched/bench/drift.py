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

The drift need not be the same at every batch: in session 35
(benchmarks/results/hetero-resnet5m) rank 0's reference at batch 16 ran at
the calibration's speed (factors 1.10, 1.00, 0.97) while its plan's batch 36
ran 10 % slower than calibrated (the plan's compute alone -9.5 % at the runs'
speed). So each rank also times the plan's batch for it in the same rounds
(taking turns with the reference batch, as the calibration's batch curve
does), and :func:`factors_by_batch` gives each rank a factor per batch;
:meth:`MeasuredSpec.rescaled` interpolates between them, so a configuration
whose batches lie between the two (speed-proportional DP) gets factors
between.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from commsched.bench.batch_curve import curve_points, time_rounds

__all__ = ["factors_by_batch", "speed_factors", "time_reference"]


def time_reference(
    model_name: str,
    batches: Sequence[int],
    seed: int,
    rank: int,
    model: torch.nn.Module,
    progress: Callable[[int], None] = lambda _round: None,
) -> list[list[float]]:
    """This rank's forward + backward ms per timed round at each of ``batches`` (by position), every rank in
    lock-step (all call it, with as many batches)."""
    return time_rounds(model_name, batches, seed, rank, model, progress)


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


def factors_by_batch(
    references: Sequence[Sequence[Mapping[str, Any]]], calibrated_ms: Callable[[int, int], float]
) -> list[list[dict[int, float]]]:
    """Per repeat, per rank: the speed factor at each batch the rank timed, ``{batch: factor}``.

    ``references[r]``: rank r's records, ``{"repeat": k, "batch": b, "ms": [...]}``
    with, where the rank also timed other batches in the same rounds,
    ``"at": {"b2": [...]}``; ``calibrated_ms(r, b)``: the calibration's
    forward + backward of rank r at batch b. A batch's figure is the median
    over rounds of its time over the reference batch's in the same round,
    times the reference's median (:func:`commsched.bench.batch_curve.curve_points`:
    drift within the repeat cancels); its factor, that figure over the
    calibration's. Raises ValueError as :func:`speed_factors` does.
    """
    repeats = sorted({int(rec["repeat"]) for recs in references for rec in recs})
    out = []
    for k in repeats:
        row = []
        for r, recs in enumerate(references):
            mine = [rec for rec in recs if int(rec["repeat"]) == k]
            if len(mine) != 1:
                raise ValueError(f"references[{r}]: repeat {k} needs one record, got {len(mine)}")
            rec = mine[0]
            times = {int(rec["batch"]): list(rec["ms"])} | {int(b): list(ms) for b, ms in rec.get("at", {}).items()}
            for b, ms in times.items():
                if not ms or len(ms) != len(times[int(rec["batch"])]) or any(not t > 0 for t in ms):
                    raise ValueError(
                        f"references[{r}]: repeat {k}, batch {b} needs one time > 0 ms per round, got {ms!r}"
                    )
            figures = curve_points(times, int(rec["batch"]))
            row.append({b: ms / calibrated_ms(r, b) for b, ms in sorted(figures.items())})
        out.append(row)
    return out
