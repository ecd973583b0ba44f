"""Clocks for the compute profiler: a mark now, and the ms between two marks.

``time.perf_counter`` on CPU. On CUDA, CUDA events recorded on the current
stream by the profiler's hooks (autograd runs backward nodes and their hooks
with the forward op's stream current), resolved after a synchronize, so the
times are GPU execution times, not launch times (run on an H200: docs/gpu.md)."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch


class _Clock(Protocol):
    def mark(self) -> Any:
        """A point in time (on the device's stream for CUDA)."""
        ...

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds from ``start`` to ``end`` (valid after :meth:`sync`)."""
        ...

    def sync(self) -> None: ...


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def sync(self) -> None:
        pass


class _CudaClock:
    """CUDA events recorded on the current stream of the calling thread."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end))

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)
