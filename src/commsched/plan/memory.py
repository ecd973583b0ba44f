"""How much device memory data-parallel training needs on one rank, and the largest batch that fits.

::

    bytes(b) = P · (1 + g + s) + a · b

``P``: parameter bytes (``workload.total_bytes``); ``g``: gradient copies (the
``.grad`` tensors plus the communication buffer that buckets them: 2);
``s``: optimizer states of the size of the parameters (Adam's two moments: 2;
SGD with momentum: 1); ``a``: activation bytes kept for backward per sample.
A rank may use ``(1 - margin)`` of its device's memory. ``a`` comes from
``workload.extra["activation_bytes_per_sample"]`` or is given; the shipped
zoo profiles do not record it, and then only the persistent state is checked
(the plan says so in its notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import CommschedError
from commsched.units import MiB
from commsched.workload import Workload

GIB = 1024 * MiB

#: Where a workload may record its activation memory per sample (bytes).
ACTIVATION_KEY = "activation_bytes_per_sample"


class InfeasibleError(CommschedError, ValueError):
    """No plan fits: a device cannot hold even one sample, or the global batch exceeds what all devices hold."""


class OutOfMemoryError(InfeasibleError):
    """Data parallelism does not fit in memory: a device cannot hold the model and one sample, or the devices
    together cannot hold the global batch (pipeline stages may still fit: :mod:`commsched.plan.staged`)."""


@dataclass(frozen=True)
class MemoryModel:
    """The memory model of the module docstring. ``activation_bytes_per_sample=None``: read it from the workload."""

    optimizer_states: float = 2.0
    gradient_copies: float = 2.0
    activation_bytes_per_sample: float | None = None

    def activation_bytes(self, workload: Workload) -> float | None:
        """``a`` for ``workload``: the model's own value, else the workload's record, else None (not modelled)."""
        if self.activation_bytes_per_sample is not None:
            return float(self.activation_bytes_per_sample)
        value = workload.extra.get(ACTIVATION_KEY)
        return float(value) if isinstance(value, int | float) else None

    def state_bytes(self, workload: Workload) -> float:
        """``P · (1 + g + s)``: what a rank holds whatever its batch."""
        return workload.total_bytes * (1 + self.gradient_copies + self.optimizer_states)

    def bytes_for(self, workload: Workload, batch: int) -> float:
        """``bytes(b)`` (activations counted as 0 when not modelled)."""
        return self.state_bytes(workload) + (self.activation_bytes(workload) or 0.0) * batch

    def max_batch(self, workload: Workload, usable_bytes: float) -> int:
        """The largest ``b`` with ``bytes(b) <= usable_bytes`` (0 if not even one sample fits; huge if unbounded)."""
        free = usable_bytes - self.state_bytes(workload)
        if free < 0:
            return 0
        a = self.activation_bytes(workload)
        if not a:
            return 1 << 40
        return math.floor(free / a)


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory at its planned batch."""

    rank: int
    device: str
    node: str
    capacity_bytes: float
    usable_bytes: float
    used_bytes: float
    max_batch: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def format_gib(nbytes: float) -> str:
    """``12.34 GiB``, or in MiB (``0.245 MiB``) below a tenth of a GiB, so small devices read sensibly."""
    if abs(nbytes) >= GIB / 10:
        return f"{nbytes / GIB:.2f} GiB"
    return f"{nbytes / MiB:.3f} MiB"


def usable_bytes(cluster: Cluster, margin: float) -> tuple[float, ...]:
    """Per rank, ``(1 - margin)`` of its device's memory."""
    return tuple(w.device.memory_gib * GIB * (1 - margin) for w in cluster.workers)


def batch_caps(workload: Workload, cluster: Cluster, memory: MemoryModel, margin: float) -> tuple[int, ...]:
    """The largest batch that fits on each rank; InfeasibleError naming the first rank where not one sample fits."""
    if not 0 <= margin < 1:
        raise InfeasibleError(f"plan: memory_margin must be in [0, 1), got {margin!r}")
    caps = []
    for w, usable in zip(cluster.workers, usable_bytes(cluster, margin), strict=True):
        cap = memory.max_batch(workload, usable)
        if cap < 1:
            need = memory.bytes_for(workload, 1)
            raise OutOfMemoryError(
                f"plan: {workload.model} does not fit on rank {w.rank} ({w.device.name} on node {w.node_name}): "
                f"one sample needs {format_gib(need)}, {format_gib(usable)} usable "
                f"({w.device.memory_gib:g} GiB less a {margin:.0%} margin): "
                f"short by {format_gib(need - usable)}"
            )
        caps.append(cap)
    return tuple(caps)


def rank_memory(
    workload: Workload, cluster: Cluster, memory: MemoryModel, margin: float, batch_sizes: tuple[int, ...]
) -> tuple[RankMemory, ...]:
    out = []
    for w, usable, b in zip(cluster.workers, usable_bytes(cluster, margin), batch_sizes, strict=True):
        out.append(
            RankMemory(
                rank=w.rank,
                device=w.device.name,
                node=w.node_name,
                capacity_bytes=w.device.memory_gib * GIB,
                usable_bytes=usable,
                used_bytes=memory.bytes_for(workload, b),
                max_batch=memory.max_batch(workload, usable),
            )
        )
    return tuple(out)
