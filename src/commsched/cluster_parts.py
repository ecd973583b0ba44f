"""The parts a cluster spec is made of: devices, links and the number types they validate with.

:mod:`commsched.cluster` assembles them into nodes and clusters (and
re-exports them); numbers are strict everywhere (a string is never read as
one, a YAML boolean is refused) and every model is frozen and refuses
unknown fields.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, field_validator

__all__ = [
    "BatchCurve",
    "Count",
    "Device",
    "Fraction",
    "Link",
    "NonNegativeFloat",
    "PositiveFloat",
    "PositiveInt",
    "SpecModel",
]


def _finite_number(value: Any) -> Any:
    # YAML reads `yes`/`true` as booleans, which pydantic would take as 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return value


# Numbers are strict: a string is never read as one (bandwidth_gbps: "10" is refused, not taken as 10).
_Number = BeforeValidator(_finite_number)
PositiveFloat = Annotated[StrictFloat, _Number, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[StrictFloat, _Number, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[StrictInt, _Number, Field(gt=0)]
Count = Annotated[StrictInt, _Number, Field(ge=1)]
#: A share of something, in (0, 1].
Fraction = Annotated[StrictFloat, _Number, Field(gt=0, le=1, allow_inf_nan=False)]


#: A device's measured ``(local batch, forward + backward ms)`` points for one model, sorted by batch.
BatchCurve = tuple[tuple[int, float], ...]


class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Device(SpecModel):
    """One accelerator type."""

    name: str = Field(min_length=1, description="e.g. 'V100'")
    speed: PositiveFloat = Field(1.0, description="compute speed relative to the profiled device")
    model_speed: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="per-model relative speed, overriding `speed`"
    )
    model_batch_ms: dict[str, dict[PositiveInt, PositiveFloat]] = Field(
        default_factory=dict,
        description="per model, measured forward + backward ms at two or more local batch sizes",
    )
    overlap_ms_per_mb: NonNegativeFloat | None = Field(
        None,
        description="ms of compute lost per MiB all-reduced while this device's host computes (measured); "
        "unset: the simulator's cpu_ms_per_mb",
    )
    overlap_ms_per_task: NonNegativeFloat | None = Field(
        None,
        description="ms of compute lost per communication task started while this device's host computes, "
        "beside its bytes (measured); unset: the simulator's cpu_per_task_ms",
    )
    overlap_comm_rate: Fraction | None = Field(
        None,
        description="the share of its uncontended rate a collective keeps while this device's host computes "
        "(measured, in (0, 1]); unset: 1, transfers do not slow down beside compute",
    )
    memory_gib: PositiveFloat

    @field_validator("model_batch_ms")
    @classmethod
    def _at_least_two_points(cls, value: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
        for model, points in value.items():
            if len(points) < 2:
                raise ValueError(f"{model}: needs at least 2 batch sizes, got {dict(points)!r}")
        return value

    def __hash__(self) -> int:
        # pydantic's frozen hash would fail on the dict; hashable devices let callers group workers by device
        curves = tuple(sorted((m, tuple(sorted(c.items()))) for m, c in self.model_batch_ms.items()))
        speeds = tuple(sorted(self.model_speed.items()))
        overlaps = (self.overlap_ms_per_mb, self.overlap_ms_per_task, self.overlap_comm_rate)
        return hash((self.name, self.speed, speeds, curves, overlaps, self.memory_gib))

    def batch_curve_for(self, model: str | None = None) -> BatchCurve:
        """``model_batch_ms[model]`` as ``(batch, ms)`` pairs sorted by batch; ``()`` where it has none."""
        if model is None or model not in self.model_batch_ms:
            return ()
        return tuple(sorted(self.model_batch_ms[model].items()))

    def speed_for(self, model: str | None = None) -> float:
        """Relative speed for ``model``: its ``model_speed`` entry if any, else ``speed``."""
        if model is not None and model in self.model_speed:
            return self.model_speed[model]
        return self.speed


class Link(SpecModel):
    """A network or bus link. Bandwidth is per direction."""

    bandwidth_gbps: PositiveFloat
    latency_us: NonNegativeFloat
    loss_rate: Annotated[StrictFloat, _Number, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    per_message_overhead_us: NonNegativeFloat = 0.0

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """``bandwidth_gbps * 1e9 / 8``."""
        return self.bandwidth_gbps * 1e9 / 8
