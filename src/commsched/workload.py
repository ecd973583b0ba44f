"""What one training iteration of a model costs: layers, tensors, compute times.

A :class:`Workload` is the per-worker view of data-parallel training: the
layers in forward order, each with its parameter tensors and its forward and
backward compute time, plus (optionally) the measured moment each gradient
became ready. Schedulers plan communication from it and the simulator replays
it. It never imports torch.

Conventions:

* ``layers`` are in forward (execution) order; backward runs in reverse.
* A tensor shared by several layers (tied weights) appears once, in the first
  layer that uses it, so ``num_params`` counts it once.
* ``grad_ready_ms[i]`` is the time from the start of backward until tensor ``i``
  of the layer has its final gradient. When absent it is derived: every tensor
  of a layer becomes ready when that layer's backward ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from commsched.errors import SpecError, spec_error_from_pydantic
from commsched.spec_files import parse_json, read_text

SCHEMA_VERSION = 1

DType = Literal["fp32", "fp16", "bf16", "fp64", "int64"]
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int64": 8}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Numbers are strict: a string is never read as one ("16" for batch_size is refused, not taken as 16),
# nor a bool; an int is a float. Lists still load as tuples.


class Tensor(_Frozen):
    """One parameter tensor (its gradient is what gets communicated)."""

    name: str = Field(min_length=1)
    numel: StrictInt = Field(gt=0)
    dtype: DType = "fp32"
    shape: tuple[StrictInt, ...] | None = None

    @model_validator(mode="after")
    def _shape_matches_numel(self) -> Tensor:
        if self.shape is not None:
            if any(d <= 0 for d in self.shape):
                raise ValueError(f"shape must have positive dimensions, got {list(self.shape)}")
            if math.prod(self.shape) != self.numel:
                raise ValueError(
                    f"shape {list(self.shape)} has {math.prod(self.shape)} elements but numel is {self.numel}"
                )
        return self

    @property
    def bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


class NormHistogram(_Frozen):
    """How large a layer's gradient chunks are: a histogram of the L2 norms of chunks of ``chunk_numel``
    consecutive elements (each tensor cut on its own, a shorter last chunk included).

    ``counts[i]`` chunks had a norm in ``[edges[i], edges[i+1])`` (the last bin closed). The
    packet-level simulator draws DLCP's per-packet magnitudes from it (importance; what a loss costs).
    """

    chunk_numel: StrictInt = Field(gt=0)
    edges: tuple[StrictFloat, ...] = Field(min_length=2)
    counts: tuple[StrictInt, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> NormHistogram:
        if len(self.edges) != len(self.counts) + 1:
            raise ValueError(f"edges has {len(self.edges)} entries, counts {len(self.counts)}: need one more edge")
        for i, e in enumerate(self.edges):
            if not math.isfinite(e) or e < 0:
                raise ValueError(f"edges[{i}] must be a finite number >= 0, got {e}")
            if i and e <= self.edges[i - 1]:
                raise ValueError(f"edges must increase, got {self.edges[i - 1]} then {e} at edges[{i}]")
        for i, c in enumerate(self.counts):
            if c < 0:
                raise ValueError(f"counts[{i}] must be >= 0, got {c}")
        if not sum(self.counts):
            raise ValueError("counts are all zero")
        return self


class Layer(_Frozen):
    """A module that owns parameters directly, with its compute times in ms.

    ``grad_norms``: optional, the magnitudes of its gradient (:class:`NormHistogram`,
    :func:`commsched.profile.record_grad_norms`); profiles without it load unchanged.
    """

    name: str = Field(min_length=1)
    tensors: tuple[Tensor, ...] = ()
    forward_ms: StrictFloat = Field(ge=0, allow_inf_nan=False)
    backward_ms: StrictFloat = Field(ge=0, allow_inf_nan=False)
    grad_ready_ms: tuple[StrictFloat, ...] | None = None
    grad_norms: NormHistogram | None = None

    @field_validator("grad_ready_ms")
    @classmethod
    def _ready_non_negative(cls, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if value is not None:
            for i, t in enumerate(value):
                if not math.isfinite(t) or t < 0:
                    raise ValueError(f"grad_ready_ms[{i}] must be a finite number >= 0, got {t}")
        return value

    @model_validator(mode="after")
    def _ready_per_tensor(self) -> Layer:
        if self.grad_ready_ms is not None and len(self.grad_ready_ms) != len(self.tensors):
            raise ValueError(
                f"grad_ready_ms has {len(self.grad_ready_ms)} entries but the layer has {len(self.tensors)} tensors"
            )
        return self

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)


class Provenance(_Frozen):
    """Where the numbers came from, so a reader can judge them."""

    kind: Literal["measured", "estimated"]
    source: str = Field(min_length=1, description="device or method, e.g. 'H100 CUDA events'")
    method: str = ""
    torch_version: str | None = None
    date: str | None = None
    command: str | None = None
    notes: str = ""


class Workload(_Frozen):
    """One model, one batch size, one device: everything a scheduler plans from."""

    schema_version: StrictInt = SCHEMA_VERSION
    model: str = Field(min_length=1)
    batch_size: StrictInt = Field(gt=0)
    device: str = Field(min_length=1)
    dtype: DType = "fp32"
    layers: tuple[Layer, ...]
    provenance: Provenance
    extra: dict[str, StrictFloat | StrictInt | StrictStr] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema version {value!r} (this commsched reads {SCHEMA_VERSION})")
        return value

    @field_validator("extra")
    @classmethod
    def _extra_finite(cls, value: dict[str, float | int | str]) -> dict[str, float | int | str]:
        # JSON has no NaN or infinity: to_json would write null, which does not load back
        for key, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"extra[{key!r}] must be a finite number, got {v}")
        return value

    @field_validator("layers")
    @classmethod
    def _unique_layer_names(cls, layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
        first: dict[str, int] = {}
        for i, layer in enumerate(layers):
            if layer.name in first:
                raise ValueError(f"name {layer.name!r} is used by layers[{first[layer.name]}] and layers[{i}]")
            first[layer.name] = i
        return layers

    @model_validator(mode="after")
    def _unique_names(self) -> Workload:
        seen: set[str] = set()
        for li, layer in enumerate(self.layers):
            for ti, t in enumerate(layer.tensors):
                if t.name in seen:
                    raise ValueError(f"layers[{li}].tensors[{ti}].name {t.name!r} appears twice")
                seen.add(t.name)
        if not seen:
            raise ValueError("the workload has no parameter tensors")
        return self

    # ---- derived quantities (cached: the model is frozen) ----

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Workload:
        """pydantic's copy, minus the cached derived values, which ``update`` may have made stale."""
        copy = super().model_copy(update=update, deep=deep)
        for name, attr in vars(Workload).items():
            if isinstance(attr, cached_property):
                copy.__dict__.pop(name, None)
        return copy

    @cached_property
    def tensors(self) -> tuple[Tensor, ...]:
        """All tensors, in forward order."""
        return tuple(t for layer in self.layers for t in layer.tensors)

    @cached_property
    def tensor_layer(self) -> tuple[int, ...]:
        """For each tensor (forward order), the index of its layer."""
        return tuple(li for li, layer in enumerate(self.layers) for _ in layer.tensors)

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def forward_ms(self) -> float:
        return sum(layer.forward_ms for layer in self.layers)

    @property
    def backward_ms(self) -> float:
        return sum(layer.backward_ms for layer in self.layers)

    @cached_property
    def grad_ready_ms(self) -> tuple[float, ...]:
        """Per tensor (forward order): ms from backward start until its gradient is final."""
        out: list[float] = []
        end_of_layer: list[float] = [0.0] * len(self.layers)
        elapsed = 0.0
        for li in range(len(self.layers) - 1, -1, -1):
            elapsed += self.layers[li].backward_ms
            end_of_layer[li] = elapsed
        for li, layer in enumerate(self.layers):
            if layer.grad_ready_ms is not None:
                out.extend(layer.grad_ready_ms)
            else:
                out.extend([end_of_layer[li]] * len(layer.tensors))
        return tuple(out)

    # ---- transformations ----

    def scaled(self, compute_factor: float, device: str | None = None) -> Workload:
        """The same workload with every compute time divided by ``compute_factor``.

        ``compute_factor`` is the speed of the target device relative to this
        profile's device (2.0 = twice as fast).
        """
        if not (compute_factor > 0 and math.isfinite(compute_factor)):
            raise SpecError("workload scaling", [f"compute_factor: must be > 0, got {compute_factor!r}"])
        layers = tuple(
            layer.model_copy(
                update={
                    "forward_ms": layer.forward_ms / compute_factor,
                    "backward_ms": layer.backward_ms / compute_factor,
                    "grad_ready_ms": None
                    if layer.grad_ready_ms is None
                    else tuple(t / compute_factor for t in layer.grad_ready_ms),
                }
            )
            for layer in self.layers
        )
        return self.model_copy(update={"layers": layers, "device": device or self.device})

    # ---- (de)serialisation ----

    def to_json(self, indent: int | None = 1) -> str:
        return self.model_dump_json(indent=indent, exclude_none=True)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: object, source: str = "workload") -> Workload:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise spec_error_from_pydantic(source, exc) from None

    @classmethod
    def from_json(cls, text: str, source: str = "workload") -> Workload:
        return cls.from_dict(parse_json(text, source), source)

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        return cls.from_json(read_text(path), source=str(path))
