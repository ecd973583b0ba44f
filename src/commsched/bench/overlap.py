"""What communicating beside compute costs a worker: its backward pass alone against beside an all-reduce.

On a GPU, a collective's copies and kernels run beside compute; on the CPU
workers of ``commsched bench --plan``'s testbed, every byte an all-reduce
moves costs the worker's core work: gloo's threads, and the kernel's TCP and
packet processing (softirq time that no process is charged for, so the
probe's ``time.process_time`` does not see it), plus the caches and memory
bandwidth the two share. Where that core also computes, compute slows down.
The probe measures communication alone; this measures it where it costs.

:func:`time_overlap` runs, on every rank in lock-step, rounds of three
measurements taking turns: backward alone, backward with an all-reduce
launched as it starts (``beside``), and that all-reduce alone.
:meth:`OverlapTimes.ms_per_mb` turns the rounds into the cluster spec's
``overlap_ms_per_mb`` (:mod:`commsched.cluster`): the backward's growth (the
median over rounds of each round's difference) over the MiB all-reduced while
it ran (all of them where the all-reduce ends first, else the share of its
time that the backward covered: the bytes taken to move evenly over the
all-reduce). The all-reduce's end is taken when it completes (a callback on
its future), not when the backward is done, so that share is known.
The same rounds give the other side of the contention:
:meth:`OverlapTimes.comm_rate`, the share of its rate the all-reduce kept
while the ranks computed (the spec's ``overlap_comm_rate``). On the testbed
of ``commsched bench --plan`` the all-reduce kept 0.62-0.70 of its rate
while the quarter-core workers computed in sessions 16-24, and 0.62-0.82 on
a host 3x faster in compute (sessions 25-37): under a quota of 2.5 ms per 10
ms period the communication threads wait while the compute spends the
period's quota.

The all-reduce moves :data:`OVERLAP_VOLUME` times the gradients' bytes. On
the testbed of ``commsched bench --plan`` (benchmarks/results/hetero-resnet5m,
sessions 10-15, the quarter-core workers), one volume of gradients grew the
backward by 24-351 ms (the median of the rounds' differences) while single
rounds of the backward alone spread over up to 720 ms: 0.6 to 17 ms/MiB,
where their backward grew by 7-15 ms per MiB beside the runtime's large
bucket in the runs (``breakdown.txt``). Four volumes give the growth four
times the signal over the same noise, and still end within those workers'
backward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from commsched.models import model_loss

__all__ = ["MIN_COMM_RATE", "OVERLAP_REPEATS", "OVERLAP_VOLUME", "OverlapTimes", "paired_growth", "time_overlap"]

#: Timed rounds (after one untimed round).
OVERLAP_REPEATS = 9
#: The all-reduce beside the backward moves this many times the gradients' bytes (the module docstring).
OVERLAP_VOLUME = 4
#: The least share of its rate :meth:`OverlapTimes.comm_rate` gives a collective beside compute (a growth
#: longer than the compute beside it is more than compute explains).
MIN_COMM_RATE = 0.05

_MODES = ("alone", "beside", "allreduce")


def paired_growth(beside_ms: Sequence[float], alone_ms: Sequence[float]) -> float:
    """The median over rounds of each round's ``beside - alone``: the two are timed next to each other, so
    the host's drift between rounds cancels (a difference of the two medians mixes it in)."""
    return statistics.median(b - a for b, a in zip(beside_ms, alone_ms, strict=True))


@dataclass(frozen=True)
class OverlapTimes:
    """One rank's timed rounds, in ms: backward alone, backward beside the all-reduce, the all-reduce beside
    the backward (from its launch to its completion, which may come before the backward's end) and alone,
    of ``nbytes``."""

    nbytes: int
    backward_alone_ms: tuple[float, ...]
    backward_beside_ms: tuple[float, ...]
    allreduce_beside_ms: tuple[float, ...]
    allreduce_alone_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.nbytes <= 0:
            raise ValueError(f"overlap.nbytes: must be > 0, got {self.nbytes!r}")
        for name in _TIMED:
            times = getattr(self, name)
            if not times or min(times) < 0:
                raise ValueError(f"overlap.{name}: needs timed rounds of >= 0 ms, got {times!r}")
        rounds = len(self.backward_alone_ms)
        for name in _TIMED[1:]:
            if len(getattr(self, name)) != rounds:
                raise ValueError(
                    f"overlap.{name}: one time per round, {rounds} as backward_alone_ms, got {len(getattr(self, name))}"
                )

    @property
    def extra_ms(self) -> float:
        """How much longer the backward took beside the all-reduce: the median over rounds of each round's
        difference (the two are timed next to each other, so the host's drift between rounds cancels;
        a difference of the two medians mixes it in); negative within noise."""
        return paired_growth(self.backward_beside_ms, self.backward_alone_ms)

    @property
    def overlapped(self) -> float:
        """The share of the all-reduce's bytes moved while the backward ran (1 where the all-reduce ended first)."""
        return min(1.0, statistics.median(self.backward_beside_ms) / statistics.median(self.allreduce_beside_ms))

    def ms_per_mb(self, per_task_ms: float = 0.0) -> float:
        """Compute lost per MiB all-reduced beside it, ``per_task_ms`` (charged per task apart) taken off; >= 0."""
        mib = self.nbytes / 2**20 * self.overlapped
        return max(0.0, self.extra_ms - per_task_ms) / mib

    def comm_rate(self, computing_ms: float) -> float:
        """The share of its rate alone the all-reduce kept while the ranks computed ``computing_ms`` beside it.

        The all-reduce alone takes ``a`` (median); beside the backward it takes
        ``a + g`` (``g`` the median of each round's difference). At rate ``r``
        while the ranks compute and full rate after: ``r = a / (a + g)`` where
        it ends inside ``computing_ms``, else ``r = 1 - g / computing_ms``
        (the simulator's :func:`~commsched.sim.contention.slowed_floor_s`
        inverted); 1 where it did not slow down, at least :data:`MIN_COMM_RATE`.
        """
        if not computing_ms > 0:
            raise ValueError(f"computing_ms: must be > 0, got {computing_ms!r}")
        alone = statistics.median(self.allreduce_alone_ms)
        growth = paired_growth(self.allreduce_beside_ms, self.allreduce_alone_ms)
        if growth <= 0 or not alone > 0:
            return 1.0
        rate = alone / (alone + growth) if alone + growth <= computing_ms else 1.0 - growth / computing_ms
        return min(1.0, max(MIN_COMM_RATE, rate))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> OverlapTimes:
        """Read what :func:`dataclasses.asdict` wrote; a ValueError naming ``source`` where it does not fit."""
        try:
            timed = [tuple(float(t) for t in data[k]) for k in _TIMED]
            return cls(int(data["nbytes"]), *timed)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: overlap: {exc}") from exc


_TIMED = ("backward_alone_ms", "backward_beside_ms", "allreduce_beside_ms", "allreduce_alone_ms")


def time_overlap(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, torch.Tensor],
    nbytes: int,
    progress: Callable[[int], None] = lambda _round: None,
) -> OverlapTimes:
    """The rounds of the module docstring on this rank (every rank of the process group calls it together).

    The three measurements take turns, their order rotated by one per round,
    so a drift of the machine's speed falls on all of them alike. Every
    backward starts after a barrier that follows the forward, so the ranks
    launch the all-reduce together.
    """
    x, y = inputs
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    times: dict[str, list[float]] = {"alone": [], "beside": [], "allreduce": [], "allreduce_beside": []}
    for i in range(1 + OVERLAP_REPEATS):
        k = i % len(_MODES)
        for mode in (*_MODES[k:], *_MODES[:k]):
            if mode == "allreduce":
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buf)
                elapsed = {"allreduce": time.perf_counter() - start}
            else:
                loss = model_loss(model(x), y)
                dist.barrier()
                start = time.perf_counter()
                work = dist.all_reduce(buf, async_op=True) if mode == "beside" else None
                # the callback runs as the all-reduce completes; its value is when
                ended = None if work is None else work.get_future().then(lambda _f: time.perf_counter())
                loss.backward()
                elapsed = {mode: time.perf_counter() - start}
                if work is not None and ended is not None:
                    work.wait()
                    elapsed["allreduce_beside"] = ended.wait() - start
                model.zero_grad(set_to_none=True)
            if i:
                for key, seconds in elapsed.items():
                    times[key].append(seconds * 1e3)
        progress(i)
    return OverlapTimes(
        nbytes=buf.numel() * 4,
        backward_alone_ms=tuple(times["alone"]),
        backward_beside_ms=tuple(times["beside"]),
        allreduce_beside_ms=tuple(times["allreduce_beside"]),
        allreduce_alone_ms=tuple(times["allreduce"]),
    )
