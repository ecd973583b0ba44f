"""What the host hands each rank of ``commsched bench`` (:class:`Job`) and how rank 0 reports progress.

Shared by the worker (:mod:`commsched.bench.worker`) and its tasks
(:mod:`commsched.bench.calibrate_task`, :mod:`commsched.bench.hetero_worker`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Job", "Progress"]


@dataclass(frozen=True)
class Job:
    """One task for every rank (``task``: ``session``, ``compute_alone`` or ``calibrate``), read from JSON."""

    task: str
    out: str
    model: str
    batch: int
    iters: int
    warmup: int
    repeats: int
    policies: list[str] = field(default_factory=list)
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    references: bool = True
    ddp_grid: bool = True
    seed: int = 0
    lr: float = 0.01
    momentum: float = 0.9
    threads: int = 1
    comm_timeout_s: float = 60.0
    mtu_bytes: int = 1500  # the links' MTU: a datagram transport's datagrams are cut to it
    pin_cores: bool = False  # rank r runs on the r-th core this process may use, every thread of it
    trace_repeat: int = 0
    fail: dict[str, Any] | None = None  # {"rank", "policy", "step"}: that rank dies there (tests)
    curve_global_batch: int = 0  # calibrate: > 0 times each rank's batch curve around its share of it
    overlap: bool = False  # calibrate: time backward alone and beside an all-reduce (bench.overlap) and beside
    # the runtime's tasks (bench.task_overlap)

    @property
    def steps(self) -> int:
        return self.warmup + self.iters


class Progress:
    """Rank 0 appends one line per step to ``progress.jsonl``, which the host follows."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def __call__(self, name: str, repeat: int, step: int) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps({"name": name, "repeat": repeat, "step": step}) + "\n")
