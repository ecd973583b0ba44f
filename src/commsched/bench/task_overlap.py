"""What each communication task of the runtime costs a worker's backward, beside the bytes it moves.

:mod:`commsched.bench.overlap` times one gloo all-reduce, launched before
the backward, and gives the cost per MiB. The runtime launches its tasks
from its own thread as gradients become ready, while the backward runs, and
each hands its start and its completion between that thread and the
training thread (on a CPU worker: between threads of one Python process, on
a core the backward also uses). On ``commsched bench --plan``'s testbed
that costs the quarter-core workers per task what no per-MiB figure covers:
in sessions 11-16 (benchmarks/results/hetero-resnet5m, ``breakdown.txt``)
their backward grew by 7-15 ms per MiB beside one large bucket and by 21-23
beside five smaller ones, where an all-reduce of four volumes of gradients,
launched before the backward, cost them 6-9 (sessions 16 and 17).

:func:`time_task_overlap` runs the runtime itself (``policy="ddp"`` with
:data:`TASK_OVERLAP_BUCKET_MB` buckets, so that many tasks start during the
backward) on every rank in lock-step, rounds of two measurements taking
turns: the backward under ``no_sync()`` (no communication; the time from the
forward's end to the backward's) and the backward with its tasks beside it
(the same interval, from the runtime's trace, which also says how many tasks
started inside it and how many MiB they moved meanwhile).
:meth:`TaskOverlap.ms_per_task` then takes the bytes' share off the growth
at a given cost per MiB and divides the rest by the tasks: the cluster
spec's ``overlap_ms_per_task``.

The calibration of ``commsched bench --plan`` runs the rounds in three
bucket layouts (:func:`layouts`), at each rank's speed-proportional share of
the global batch (where plans put it): those small buckets, one large bucket
started inside the backward (:data:`LARGE_FIRST_SHARE`) and many finer ones
(:data:`FINE_BUCKET_MB`). Each layout gives one equation in the two costs;
:func:`fit_costs` fits both, measured on the runtime itself. On the
testbed's quarter-core workers the plans' one large bucket cost 1.2-2.0
times what a gloo all-reduce's cost per MiB and the small buckets' per
task predicted (sessions 25-30, ``breakdown.txt``), and Horovod's 19 tasks
more than a fit to one and six tasks alone (session 34).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commsched.bench.overlap import paired_growth
from commsched.models import build_model, model_loss
from commsched.runtime import parallelize
from commsched.runtime.api import ParallelModule
from commsched.trace import COMM_KINDS, TraceEvent

__all__ = [
    "FINE_BUCKET_MB",
    "LARGE_FIRST_SHARE",
    "TASK_OVERLAP_BUCKET_MB",
    "TaskOverlap",
    "beside_backward",
    "fit_costs",
    "layouts",
    "time_task_overlap",
]

#: The runtime's bucket cap while timing (resnet5m, whose largest tensors are 9, 4.5 and 2.25 MiB: 8 buckets,
#: 6 of them started while the backward runs).
TASK_OVERLAP_BUCKET_MB = 1.0
#: The second layout timed: a first bucket of this share of the gradients' bytes, the rest in one more (one
#: large task starts while the backward runs, the other after it, as in the plans made on the testbed).
LARGE_FIRST_SHARE = 0.75
#: The third: buckets this small (resnet5m: 13 of them, 12 started while the backward runs), many tasks.
FINE_BUCKET_MB = 0.25


@dataclass(frozen=True)
class TaskOverlap:
    """One rank's rounds: backward alone and beside the runtime's tasks (ms), and per beside-round the tasks
    that started inside the backward and the MiB they moved while it ran."""

    alone_ms: tuple[float, ...]
    beside_ms: tuple[float, ...]
    tasks: tuple[int, ...]
    mib: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("alone_ms", "beside_ms", "tasks", "mib"):
            values = getattr(self, name)
            if not values or min(values) < 0:
                raise ValueError(f"task_overlap.{name}: needs timed rounds of values >= 0, got {values!r}")
            if len(values) != len(self.alone_ms):
                raise ValueError(
                    f"task_overlap.{name}: one value per round, {len(self.alone_ms)} as alone_ms, got {len(values)}"
                )

    @property
    def extra_ms(self) -> float:
        """The backward's growth: the median over rounds of each round's difference (drift cancels)."""
        return paired_growth(self.beside_ms, self.alone_ms)

    def ms_per_task(self, ms_per_mb: float) -> float | None:
        """The growth less ``ms_per_mb`` per MiB moved beside the backward, per task started in it; >= 0;
        ``None`` where no task started inside the backward (nothing to divide by)."""
        tasks = statistics.median(self.tasks)
        if tasks <= 0:
            return None
        return max(0.0, self.extra_ms - ms_per_mb * statistics.median(self.mib)) / tasks

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> TaskOverlap:
        """Read what :func:`dataclasses.asdict` wrote; a ValueError naming ``source`` where it does not fit."""
        try:
            return cls(
                tuple(float(t) for t in data["alone_ms"]),
                tuple(float(t) for t in data["beside_ms"]),
                tuple(int(n) for n in data["tasks"]),
                tuple(float(m) for m in data["mib"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: task_overlap: {exc}") from exc


def fit_costs(*timed: TaskOverlap) -> tuple[float, float]:
    """The cost per task and per MiB (ms), both >= 0, that best give the layouts' growths: ``growth = tasks · t
    + MiB · m`` over the medians of each layout, by non-negative least squares (``scipy.optimize.nnls``); a
    growth below noise counts as 0."""
    if len(timed) < 2:
        raise ValueError(f"layouts: two or more are needed to tell a task's cost from its bytes', got {len(timed)}")
    a = np.array([[statistics.median(o.tasks), statistics.median(o.mib)] for o in timed], dtype=float)
    b = np.array([max(0.0, o.extra_ms) for o in timed], dtype=float)
    import scipy.optimize  # here, not at the top: scipy adds ~0.2 s to every CLI start

    (per_task, per_mb), _ = scipy.optimize.nnls(a, b)
    return float(per_task), float(per_mb)


def layouts(model_mb: float) -> dict[str, tuple[float, float]]:
    """The bucket layouts the calibration times, by the key it saves them under: ``(bucket_cap_mb,
    first_bucket_mb)`` for the runtime's ``ddp`` policy on a model of ``model_mb`` MB of gradients."""
    return {
        "task_overlap": (TASK_OVERLAP_BUCKET_MB, TASK_OVERLAP_BUCKET_MB),
        "task_overlap_large": (model_mb, LARGE_FIRST_SHARE * model_mb),
        "task_overlap_fine": (FINE_BUCKET_MB, FINE_BUCKET_MB),
    }


def beside_backward(events: Iterable[TraceEvent], worker: int, iteration: int) -> tuple[float, int, float] | None:
    """From a runtime trace: ``worker``'s backward in ``iteration`` as (ms from its start to its end, tasks
    started inside it, MiB they moved while it ran: each task's bytes times the share of its time inside);
    ``None`` where the trace has no backward there."""
    mine = [e for e in events if e.worker == worker and e.iteration == iteration]
    backward = [e for e in mine if e.kind == "backward"]
    if not backward:
        return None
    lo, hi = min(e.start_s for e in backward), max(e.end_s for e in backward)
    tasks, mib = 0, 0.0
    for e in mine:
        if e.kind not in COMM_KINDS:
            continue
        tasks += lo <= e.start_s < hi
        inside = max(0.0, min(hi, e.end_s) - max(lo, e.start_s))
        share = inside / e.duration_s if e.duration_s > 0 else float(lo <= e.start_s <= hi)
        mib += e.bytes * share / 2**20
    return (hi - lo) * 1e3, tasks, mib


def time_task_overlap(
    model_name: str,
    seed: int,
    inputs: tuple[torch.Tensor, torch.Tensor],
    rounds: int,
    timeout_s: float,
    progress: Callable[[int], None] = lambda _round: None,
    *,
    bucket_cap_mb: float = TASK_OVERLAP_BUCKET_MB,
    first_bucket_mb: float = TASK_OVERLAP_BUCKET_MB,
) -> TaskOverlap | None:
    """The rounds of the module docstring on this rank (every rank of the process group calls it together),
    on a fresh replica of ``model_name`` (the runtime's hooks stay on the model it wraps).

    The two measurements take turns, their order swapped every round; every
    forward starts after a barrier. The runtime's warm-up iteration and one
    round more go untimed. ``None`` where the trace held no backward of this
    rank in any round (nothing to compare).
    """
    rank = dist.get_rank()
    model = build_model(model_name, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    wrapped, optimizer = parallelize(
        model,
        opt,
        policy="ddp",
        bucket_cap_mb=bucket_cap_mb,
        first_bucket_mb=first_bucket_mb,
        warmup_iters=1,
        timeout_s=timeout_s,
        trace=True,
    )
    assert isinstance(wrapped, ParallelModule) and wrapped.trace is not None  # parallelize(trace=True)
    trace = wrapped.trace
    x, y = inputs
    alone: list[float] = []
    beside: list[tuple[float, int, float]] = []
    try:
        for i in range(2 + rounds):
            by_mode: dict[bool, Any] = {}
            for synced in (True, False) if i % 2 else (False, True):
                if i == 0 and not synced:
                    continue  # the warm-up iteration is synchronised
                dist.barrier()
                if synced:
                    seen = len(trace.events)
                    loss = model_loss(wrapped(x), y)
                    loss.backward()
                    optimizer.step()
                    wrapped.flush()
                    new = trace.events[seen:]
                    iterations = [e.iteration for e in new if e.kind == "backward" and e.worker == rank]
                    by_mode[True] = beside_backward(new, rank, max(iterations)) if iterations else None
                else:
                    with wrapped.no_sync():
                        out = wrapped(x)
                        start = time.perf_counter()
                        model_loss(out, y).backward()
                        by_mode[False] = (time.perf_counter() - start) * 1e3
                optimizer.zero_grad(set_to_none=True)
            if i >= 2 and by_mode.get(True) is not None:  # a round counts with both of its measurements
                alone.append(by_mode[False])
                beside.append(by_mode[True])
            progress(i)
    finally:
        wrapped.close()
    if not beside:
        return None
    return TaskOverlap(
        alone_ms=tuple(alone),
        beside_ms=tuple(b[0] for b in beside),
        tasks=tuple(b[1] for b in beside),
        mib=tuple(b[2] for b in beside),
    )
