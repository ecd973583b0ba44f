"""What one ``commsched bench`` run measures (:class:`BenchConfig`), checked before anything starts.

It also holds the warm-up iterations the policies need before they are timed:
a commsched policy profiles its warm-up iterations, then switches to its plan
(:data:`MIN_WARMUP`); ``auto`` tries plans before it keeps one (:data:`AUTO_WARMUP`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from commsched.models import MODELS
from commsched.runtime import RUNTIME_POLICIES
from commsched.runtime.switching import auto_settles_after
from commsched.runtime.warmup import WARMUP_ITERS
from commsched.schedule import AUTO
from commsched.testbed.commands import LinkShape
from commsched.testbed.loopback import Isolation
from commsched.transport.base import check_mtu

DEFAULT_POLICIES = tuple(RUNTIME_POLICIES)
#: Untimed iterations a commsched policy needs: it profiles its warm-up iterations, then switches to its plan.
MIN_WARMUP = WARMUP_ITERS + 1
#: Iterations before ``auto`` runs the plan it keeps, at most (after its trials: its choice, the runner-up, its
#: near-ties and, when all seem slower than the warm-up, the warm-up's plan).
AUTO_WARMUP = auto_settles_after(WARMUP_ITERS)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "resnet5m"
    workers: int = 4
    shapes: tuple[LinkShape, ...] = (LinkShape(),)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    iters: int = 10
    warmup: int = 3
    repeats: int = 3
    batch: int = 8
    threads: int = 1
    seed: int = 0
    lr: float = 0.01
    comm_timeout_s: float = 60.0
    references: bool = True
    ddp_grid: bool = True
    probe: bool = True
    pin_cores: bool = False  # worker r's process on core r alone (every thread of it)
    validate: bool = False
    isolation: Isolation = "auto"
    mtu_bytes: int = 1500  # every veth's MTU; a datagram transport (dlcp) cuts its datagrams to it
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    fail: Mapping[str, Any] | None = None  # make one rank die (tests of the failure path)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; known: {', '.join(MODELS)}")
        unknown = [p for p in self.policies if p not in RUNTIME_POLICIES]
        if unknown or not self.policies:
            raise ValueError(
                f"policies: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(RUNTIME_POLICIES)}"
            )
        if self.workers < 2:
            raise ValueError(f"workers: data parallelism needs at least 2, got {self.workers!r}")
        for name, value in (
            ("iters", self.iters),
            ("repeats", self.repeats),
            ("batch", self.batch),
            ("threads", self.threads),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value!r}")
        if self.warmup < MIN_WARMUP and any(p != "torch_ddp" for p in self.policies):
            raise ValueError(
                f"warmup: commsched policies profile for 2 iterations and switch plans; need >= {MIN_WARMUP}, "
                f"got {self.warmup}"
            )
        if not self.shapes:
            raise ValueError("shapes: need at least one link shaping")
        check_mtu("mtu", self.mtu_bytes)
        cores = len(os.sched_getaffinity(0))
        if self.pin_cores and self.workers > cores:
            raise ValueError(
                f"pin_cores: {self.workers} workers need a core each; this process may run on {cores} core(s)"
            )

    def notes(self) -> list[str]:
        """What a reader of this configuration's results should know (nothing wrong with it)."""
        if AUTO in self.policies and self.warmup < AUTO_WARMUP:
            return [
                f"auto measures its choice, the runner-up and near-ties (and, if all seem slower, the warm-up's "
                f"plan) before it keeps one ({AUTO_WARMUP} iterations at most); "
                f"with --warmup {self.warmup} its timed iterations include those trials "
                f"(--warmup {AUTO_WARMUP} times only the plan it keeps)"
            ]
        return []
