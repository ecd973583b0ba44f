"""Pipeline stages in a plan: layer ranges placed on ranks, data parallel across pipelines.

A model that does not fit a device is cut into **stages**, contiguous ranges
of its layers (``starts[s]`` is the first layer of stage ``s``, in the
workload's layer order; the last stage runs to the last layer). A
**pipeline** is a chain of ranks that together hold every stage: rank
``ranks[i]`` runs stages ``first_stage[i]`` up to the next rank's first stage
(the last rank to the end), so a device with room for the whole model is a
pipeline of one rank. Each pipeline takes ``batch_size`` samples of every
global batch (the global batch is their sum) in ``micro_batches`` equal
micro-batches; the ranks that hold stage ``s`` (one per pipeline) keep
replicas of its parameters and sum their gradients, each weighted by its
pipeline's share of the global batch, so training equals one process on the
global batch (HetPipe's virtual workers, Park et al., ATC 2020; per-stage
data parallelism as in Alpa, Zheng et al., OSDI 2022).

``schedule``: ``"1f1b"`` (one forward, one backward: stage ``s`` of ``S`` holds
at most ``S - s`` micro-batches' activations; Narayanan et al., PipeDream,
SOSP 2019) or ``"gpipe"`` (every forward, then every backward; Huang et al.,
NeurIPS 2019); both give the same gradients.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

PipelineSchedule = Literal["1f1b", "gpipe"]
PIPELINE_SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Pipeline:
    """One chain of ranks holding every stage once; ``batch_size`` samples of each global batch."""

    ranks: tuple[int, ...]
    first_stage: tuple[int, ...]
    batch_size: int
    micro_batches: int = 1

    @property
    def depth(self) -> int:
        return len(self.ranks)

    def stages_of(self, position: int, num_stages: int) -> range:
        """The stages the rank at ``position`` in this pipeline runs."""
        stop = self.first_stage[position + 1] if position + 1 < len(self.ranks) else num_stages
        return range(self.first_stage[position], stop)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "first_stage": list(self.first_stage),
            "batch_size": self.batch_size,
            "micro_batches": self.micro_batches,
        }


@dataclass(frozen=True)
class StageLayout:
    """Stages (layer ranges) and the pipelines that run them (module docstring)."""

    starts: tuple[int, ...]
    pipelines: tuple[Pipeline, ...]
    schedule: PipelineSchedule = "1f1b"

    @property
    def num_stages(self) -> int:
        return len(self.starts)

    @property
    def global_batch(self) -> int:
        return sum(p.batch_size for p in self.pipelines)

    @property
    def max_depth(self) -> int:
        return max(p.depth for p in self.pipelines)

    def layers_of(self, stage: int, num_layers: int) -> range:
        stop = self.starts[stage + 1] if stage + 1 < len(self.starts) else num_layers
        return range(self.starts[stage], stop)

    def stage_of_layer(self, layer: int) -> int:
        return max(s for s, start in enumerate(self.starts) if start <= layer)

    @cached_property
    def placement(self) -> dict[int, tuple[int, int]]:
        """Rank -> (pipeline index, position in it)."""
        return {r: (p, i) for p, pipe in enumerate(self.pipelines) for i, r in enumerate(pipe.ranks)}

    def stages_of_rank(self, rank: int) -> range:
        p, i = self.placement[rank]
        return self.pipelines[p].stages_of(i, self.num_stages)

    def holders(self, stage: int) -> tuple[int, ...]:
        """The ranks that hold ``stage``, one per pipeline, in pipeline order."""
        out = []
        for pipe in self.pipelines:
            for i, r in enumerate(pipe.ranks):
                if stage in pipe.stages_of(i, self.num_stages):
                    out.append(r)
        return tuple(out)

    def problems(self, num_layers: int, world: int) -> list[str]:
        """What is wrong with this layout for ``num_layers`` layers on ``world`` ranks (empty: nothing)."""
        out = []
        starts = self.starts
        if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            out.append(f"stages.starts: must begin at layer 0 and increase, got {list(starts)}")
        elif starts[-1] >= num_layers:
            out.append(f"stages.starts: a stage starts at layer {starts[-1]}, the model has {num_layers} layers")
        if self.schedule not in PIPELINE_SCHEDULES:
            out.append(f"stages.schedule: one of {', '.join(PIPELINE_SCHEDULES)}, got {self.schedule!r}")
        if not self.pipelines:
            out.append("stages.pipelines: at least one pipeline, got none")
        seen: list[int] = []
        for p, pipe in enumerate(self.pipelines):
            where = f"stages.pipelines[{p}]"
            if not pipe.ranks or len(pipe.first_stage) != len(pipe.ranks):
                out.append(
                    f"{where}: one first_stage per rank, got ranks {list(pipe.ranks)}, "
                    f"first_stage {list(pipe.first_stage)}"
                )
                continue
            first = pipe.first_stage
            if first[0] != 0 or any(b <= a for a, b in itertools.pairwise(first)) or first[-1] >= len(starts):
                out.append(
                    f"{where}.first_stage: must begin at stage 0 and increase below {len(starts)}, got {list(first)}"
                )
            for name, value in (("batch_size", pipe.batch_size), ("micro_batches", pipe.micro_batches)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    out.append(f"{where}.{name}: must be a whole number >= 1, got {value!r}")
            if self.schedule == "1f1b" and pipe.depth > 1 and pipe.micro_batches < pipe.depth:
                out.append(
                    f"{where}.micro_batches: 1f1b needs at least one micro-batch per stage ({pipe.depth}), "
                    f"got {pipe.micro_batches}"
                )
            if not out and pipe.batch_size % pipe.micro_batches:
                out.append(
                    f"{where}.micro_batches: {pipe.micro_batches} does not divide the batch {pipe.batch_size} "
                    "(micro-batches are equal)"
                )
            seen.extend(pipe.ranks)
        if sorted(seen) != list(range(world)):
            out.append(f"stages.pipelines: every rank of {world} exactly once, got ranks {sorted(seen)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "starts": list(self.starts),
            "schedule": self.schedule,
            "pipelines": [p.to_dict() for p in self.pipelines],
        }

    @classmethod
    def from_dict(cls, data: Any) -> StageLayout:
        """The layout from its JSON form; ValueError naming the field that is malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"stages: expected an object or null, got {type(data).__name__}")
        pipelines = data.get("pipelines")
        if not isinstance(pipelines, list):
            raise ValueError(f"stages.pipelines: expected a list, got {pipelines!r}")
        out = []
        for p, raw in enumerate(pipelines):
            if not isinstance(raw, dict):
                raise ValueError(f"stages.pipelines[{p}]: expected an object, got {raw!r}")
            try:
                out.append(
                    Pipeline(
                        ranks=tuple(_ints(raw["ranks"], f"stages.pipelines[{p}].ranks")),
                        first_stage=tuple(_ints(raw["first_stage"], f"stages.pipelines[{p}].first_stage")),
                        batch_size=raw["batch_size"],
                        micro_batches=raw.get("micro_batches", 1),
                    )
                )
            except KeyError as exc:
                raise ValueError(f"stages.pipelines[{p}].{exc.args[0]}: missing") from None
        return cls(
            starts=tuple(_ints(data.get("starts"), "stages.starts")),
            pipelines=tuple(out),
            schedule=data.get("schedule", "1f1b"),
        )


def _ints(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValueError(f"{where}: expected a list of whole numbers, got {value!r}")
    return value
