"""The PyTorch DDP configurations every ``commsched bench`` session measures beside the policies.

Users compare against two baselines:

* **default DDP**: ``DistributedDataParallel(model)`` with PyTorch's defaults
  (``bucket_cap_mb=25``, ``find_unused_parameters=False``), what they run;
* **best DDP**: the fastest (median iteration time over repeats) of the grid
  ``bucket_cap_mb`` ∈ {1, 4, 25} × ``find_unused_parameters`` ∈ {False, True},
  measured in the same session.

Names: ``ddp[<cap>MiB]`` for ``find_unused_parameters=False`` and
``ddp[<cap>MiB,find_unused]`` for ``True``, with one exception: (25, True) is
``torch_ddp``, what ``commsched.parallelize(policy="torch_ddp")`` builds and the
reference of the parameter check. ``ddp[1MiB,find_unused]`` is the yardstick:
its parameter difference from ``torch_ddp`` is what reordering the gradient
sums alone does (reports written before the grid call it ``torch_ddp_1mb``).

``find_unused_parameters=True`` keeps DDP's initial buckets (registration
order); ``False`` lets DDP rebuild them in gradient-ready order after the first
iteration. Which is faster depends on the model and the links, hence the grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TORCH_DDP = "torch_ddp"


@dataclass(frozen=True)
class DdpConfig:
    """One ``DistributedDataParallel`` configuration of the grid."""

    bucket_cap_mb: int
    find_unused_parameters: bool

    @property
    def name(self) -> str:
        if (self.bucket_cap_mb, self.find_unused_parameters) == (25, True):
            return TORCH_DDP
        return f"ddp[{self.bucket_cap_mb}MiB{',find_unused' if self.find_unused_parameters else ''}]"

    @property
    def simulated_as(self) -> tuple[str, dict[str, Any]]:
        """The simulator's ``ddp`` policy with these buckets (initial ones when unused parameters are searched)."""
        return "ddp", {"rebuilt": not self.find_unused_parameters, "bucket_cap_mb": float(self.bucket_cap_mb)}


DEFAULT_DDP = DdpConfig(25, False)
YARDSTICK_DDP = DdpConfig(1, True)
#: Every configuration, the default first; ``torch_ddp`` and the yardstick are (25, True) and (1, True).
DDP_GRID: tuple[DdpConfig, ...] = tuple(DdpConfig(cap, unused) for unused in (False, True) for cap in (25, 4, 1))
BY_NAME: dict[str, DdpConfig] = {c.name: c for c in DDP_GRID}

YARDSTICK = YARDSTICK_DDP.name
LEGACY_YARDSTICK = "torch_ddp_1mb"  # the yardstick's name in reports written before the grid


def ddp_names(*, grid: bool, references: bool) -> list[str]:
    """The DDP configurations a session runs: the grid, or (``grid=False``) ``torch_ddp``, default DDP
    (what users run: always measured) and, with the references, the yardstick."""
    if grid:
        return [c.name for c in DDP_GRID]
    return [TORCH_DDP, DEFAULT_DDP.name, *([YARDSTICK] if references else [])]


def best_ddp(summary: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The grid configuration with the lowest median iteration time; None unless all of the grid was measured.

    Ties go to the earlier configuration of :data:`DDP_GRID` (the default first).
    """
    names = [c.name for c in DDP_GRID]
    if not all(name in summary for name in names):
        return None
    return min(names, key=lambda name: summary[name]["median_ms"])
