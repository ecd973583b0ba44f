"""``CommPlan``: the static part of a policy, typed, versioned and saved as JSON.

A plan says what is communicated (tasks over segments of gradients), in which
pieces, by which transport with which loss bound, in what dependency order,
and when reduced gradients are applied. It names the policy whose online state
machine runs it, that policy's knobs (a typed dataclass, never an untyped
mapping) and the network estimate it was made for, so a plan made by the
simulator, a planner or a person can be saved, read and run by the runtime
unchanged::

    plan = commsched.schedule.build_plan("dear", workload, network, threshold_mb=8)
    plan.save("plan.json")
    model, opt = commsched.parallelize(model, opt, plan="plan.json")

A plan may also fix the **per-rank batch sizes** (``batch_sizes``: one local
batch per rank, summing to the global batch; ``None`` = every rank the same
batch). The runtime then weights rank ``r``'s gradient by ``b_r / B`` and sums,
so a mean-reduced loss trains as one process on the whole global batch
(``docs/runtime.md``).

A plan may name the ranks that run the **parameter servers** of its tasks on
the ``"ps"`` transport (``servers``: each owns an even slice of every such
task, reduce-to-owner with one; ``None`` = a server on every rank), and it may
cut the model into **pipeline stages** (``stages``, a
:class:`~commsched.schedule.stages.StageLayout`: layer ranges on ranks, data
parallel across pipelines; the per-pipeline batches are then the layout's and
``batch_sizes`` is ``None``).

The JSON file carries ``format`` and ``version`` (:data:`PLAN_VERSION`; files of
every version in :data:`READABLE_VERSIONS` are read: a version-1 file is a plan
without ``batch_sizes``, a version-2 file one without ``servers`` and
``stages``). A file of another format or an unknown version is refused with a
clear error, as is one that is internally inconsistent (:meth:`CommPlan.check`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from commsched.errors import ScheduleError, SpecError
from commsched.schedule.base import (
    FINAL_KINDS,
    READING_KINDS,
    REDUCING_KINDS,
    TASK_KINDS,
    CommTask,
    NetworkEstimate,
    Segment,
    UpdateMode,
)
from commsched.schedule.knobs import Knobs
from commsched.schedule.stages import StageLayout
from commsched.spec_files import parse_json, read_text
from commsched.workload import Workload

PLAN_FORMAT = "commsched.CommPlan"
#: The version written. 2 added ``batch_sizes``; 3 added ``servers`` and ``stages``.
PLAN_VERSION = 3
#: The versions read; a version-1 file has no ``batch_sizes`` (every rank the same batch), a version-2 file
#: no ``servers`` (a server on every rank) and no ``stages`` (every rank the whole model).
READABLE_VERSIONS = (1, 2, 3)
#: The fields each version added, refused in files of earlier versions.
_ADDED_IN = {"batch_sizes": 2, "servers": 3, "stages": 3, "micro_batch": 3}


@dataclass(frozen=True)
class CommPlan:
    """The static part of a policy: what is communicated, in which pieces, and when updates apply."""

    policy: str
    workload: Workload = field(repr=False)
    network: NetworkEstimate
    tasks: tuple[CommTask, ...]
    update: UpdateMode
    knobs: Knobs
    #: Local batch of each rank (one per rank, each >= 1), or None: every rank the same batch.
    batch_sizes: tuple[int, ...] | None = None
    #: The ranks that run parameter servers for tasks on the ``"ps"`` transport, or None: every rank.
    servers: tuple[int, ...] | None = None
    #: Pipeline stages and the pipelines that run them, or None: every rank the whole model.
    stages: StageLayout | None = None
    #: Equal micro-batches: every entry of ``batch_sizes`` is a multiple of it, rank ``r`` accumulates
    #: ``b_r / micro_batch`` of them per step (per-micro-batch statistics such as BatchNorm's then match
    #: across ranks); None: each rank its batch in one pass.
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "servers"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        self.check()

    @property
    def version(self) -> int:
        """The format version this plan is written in (:data:`PLAN_VERSION`)."""
        return PLAN_VERSION

    @property
    def global_batch(self) -> int | None:
        """Samples per iteration over all ranks when the plan fixes the per-rank (or per-pipeline) batches."""
        if self.stages is not None:
            return self.stages.global_batch
        return None if self.batch_sizes is None else sum(self.batch_sizes)

    # ---- derived maps ----

    @cached_property
    def final_tasks_of_tensor(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the tasks whose completion delivers its reduced gradient."""
        out: list[list[int]] = [[] for _ in self.workload.tensors]
        for task in self.tasks:
            if task.kind in FINAL_KINDS:
                for t in task.tensors:
                    out[t].append(task.id)
        return tuple(tuple(x) for x in out)

    @cached_property
    def final_tasks_of_layer(self) -> tuple[tuple[int, ...], ...]:
        """For each layer, the tasks that must finish before its update can be applied."""
        per_layer: list[dict[int, None]] = [{} for _ in self.workload.layers]
        for t, layer in enumerate(self.workload.tensor_layer):
            per_layer[layer].update(dict.fromkeys(self.final_tasks_of_tensor[t]))
        return tuple(tuple(d) for d in per_layer)

    @cached_property
    def tasks_reading_tensor(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the tasks that read its local gradient (need it ready before they start)."""
        out: list[list[int]] = [[] for _ in self.workload.tensors]
        for task in self.tasks:
            if task.kind in READING_KINDS:
                for t in task.tensors:
                    out[t].append(task.id)
        return tuple(tuple(x) for x in out)

    @property
    def total_bytes(self) -> int:
        """Gradient bytes reduced per iteration (an RS+AG or push+pull pair counts once)."""
        return sum(t.bytes for t in self.tasks if t.kind in REDUCING_KINDS)

    @property
    def lossless(self) -> bool:
        return all(t.loss_bound == 0 for t in self.tasks)

    # ---- validation ----

    def check(self) -> None:
        """Ids in order, known kinds and dependencies, segments in bounds, every element reduced and
        delivered exactly once, loss bounds in [0, 1), ``batch_sizes`` one whole number >= 1 per rank,
        ``servers`` distinct ranks, ``stages`` a layout of the model's layers over every rank."""
        w = self.workload
        if self.update not in ("step", "forward"):
            raise ScheduleError(f"{self.policy}: update must be 'step' or 'forward', got {self.update!r}")
        if self.network.world_size < 1:
            raise ScheduleError(f"{self.policy}: network.world_size must be >= 1, got {self.network.world_size}")
        if self.batch_sizes is not None:
            problems = batch_sizes_problems(self.batch_sizes, self.network.world_size)
            if problems:
                raise ScheduleError(f"{self.policy}: {'; '.join(problems)}")
        problems = servers_problems(self.servers, self.network.world_size)
        if self.stages is not None:
            problems += self.stages.problems(len(w.layers), self.network.world_size)
            if self.batch_sizes is not None:
                problems.append("batch_sizes: must be null when the plan has stages (each pipeline has its batch)")
        if self.micro_batch is not None:
            m = self.micro_batch
            if isinstance(m, bool) or not isinstance(m, int) or m < 1 or self.batch_sizes is None:
                problems.append(f"micro_batch: a whole number >= 1 dividing every entry of batch_sizes, got {m!r}")
            elif any(b % m for b in self.batch_sizes):
                problems.append(f"micro_batch: {m} does not divide every entry of batch_sizes {list(self.batch_sizes)}")
        if problems:
            raise ScheduleError(f"{self.policy}: {'; '.join(problems)}")
        for i, task in enumerate(self.tasks):
            if task.id != i:
                raise ScheduleError(f"{self.policy}: task at position {i} has id {task.id}")
            if task.kind not in TASK_KINDS:
                raise ScheduleError(f"{self.policy}: task {i} has unknown kind {task.kind!r}; known: {TASK_KINDS}")
            if not 0 <= task.loss_bound < 1:
                raise ScheduleError(f"{self.policy}: task {i} has loss_bound {task.loss_bound}; must be in [0, 1)")
            if not task.segments:
                raise ScheduleError(f"{self.policy}: task {i} ({task.name!r}) has no segments")
            for d in task.deps:
                if not 0 <= d < len(self.tasks) or d == i:
                    raise ScheduleError(f"{self.policy}: task {i} has invalid dependency {d}")
            for s in task.segments:
                if not 0 <= s.tensor < len(w.tensors):
                    raise ScheduleError(f"{self.policy}: task {i} names unknown tensor {s.tensor}")
                if not 0 <= s.start < s.stop <= w.tensors[s.tensor].numel:
                    raise ScheduleError(f"{self.policy}: task {i} has segment {s} outside tensor bounds")
        for role, kinds in (("reduced", REDUCING_KINDS), ("delivered", FINAL_KINDS)):
            covered = [0] * len(w.tensors)
            for task in self.tasks:
                if task.kind in kinds:
                    for s in task.segments:
                        covered[s.tensor] += s.numel
            for t, n in enumerate(covered):
                if n != w.tensors[t].numel:
                    raise ScheduleError(
                        f"{self.policy}: tensor {w.tensors[t].name} has {n} of {w.tensors[t].numel} elements {role}"
                    )

    # ---- files ----

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": self.version,
            "policy": self.policy,
            "knobs": self.knobs.to_dict(),
            "update": self.update,
            "batch_sizes": None if self.batch_sizes is None else list(self.batch_sizes),
            "servers": None if self.servers is None else list(self.servers),
            "stages": None if self.stages is None else self.stages.to_dict(),
            "micro_batch": self.micro_batch,
            "network": self.network.to_dict(),
            "tasks": [_task_to_dict(t) for t in self.tasks],
            "workload": json.loads(self.workload.to_json(indent=None)),
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: Any, source: str = "plan") -> CommPlan:
        """A plan from its JSON form; every problem raises SpecError naming ``source`` and the field."""
        from commsched.schedule.registry import policy_class

        if not isinstance(data, dict):
            raise SpecError(source, [f"<root>: expected a JSON object, got {type(data).__name__}"])
        if data.get("format") != PLAN_FORMAT:
            raise SpecError(source, [f"format: expected {PLAN_FORMAT!r}, got {data.get('format')!r}"])
        version = data.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            readable = ", ".join(map(str, READABLE_VERSIONS))
            raise SpecError(source, [f"version: this commsched reads versions {readable}, got {version!r}"])
        missing = [k for k in ("policy", "knobs", "update", "network", "tasks", "workload") if k not in data]
        if missing:
            raise SpecError(source, [f"{k}: missing" for k in missing])
        late = [
            f"{k}: not a field of version {version} (it came with version {v})"
            for k, v in _ADDED_IN.items()
            if version < v and data.get(k) is not None
        ]
        if late:
            raise SpecError(source, late)
        batch_sizes = data.get("batch_sizes")
        if batch_sizes is not None:
            if not isinstance(batch_sizes, list):
                raise SpecError(source, [f"batch_sizes: expected a list or null, got {batch_sizes!r}"])
            world = data["network"].get("world_size") if isinstance(data["network"], dict) else None
            problems = batch_sizes_problems(batch_sizes, world if isinstance(world, int) else None)
            if problems:
                raise SpecError(source, problems)
            batch_sizes = tuple(batch_sizes)
        servers = data.get("servers")
        if servers is not None:
            world = data["network"].get("world_size") if isinstance(data["network"], dict) else None
            problems = servers_problems(servers, world if isinstance(world, int) else None)
            if problems:
                raise SpecError(source, problems)
            servers = tuple(servers)
        try:
            scheduler = policy_class(data["policy"])
            knobs = scheduler.knob_type.parse(data["knobs"])
            network = NetworkEstimate(**data["network"])
            workload = Workload.from_dict(data["workload"], source=f"{source}: workload")
            tasks = tuple(_task_from_dict(i, t) for i, t in enumerate(data["tasks"]))
            stages = None if data.get("stages") is None else StageLayout.from_dict(data["stages"])
            micro = data.get("micro_batch")
            return cls(
                data["policy"], workload, network, tasks, data["update"], knobs, batch_sizes, servers, stages, micro
            )
        except (ScheduleError, TypeError, KeyError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(source, [str(exc)]) from None

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> CommPlan:
        return cls.from_dict(parse_json(text, source), source)

    @classmethod
    def load(cls, path: str | Path) -> CommPlan:
        return cls.from_json(read_text(path), str(path))


def batch_sizes_problems(batch_sizes: Any, world: int | None) -> list[str]:
    """What is wrong with ``batch_sizes`` as per-rank batches of ``world`` ranks (None: any number), one
    ``"batch_sizes...: ..."`` line per problem; empty when it is a sequence of ``world`` whole numbers >= 1."""
    if isinstance(batch_sizes, str | bytes) or not isinstance(batch_sizes, list | tuple):
        return [f"batch_sizes: expected a list of whole numbers, one per rank, got {batch_sizes!r}"]
    problems = []
    if world is not None and len(batch_sizes) != world:
        problems.append(
            f"batch_sizes: expected one entry per rank ({world}), got {len(batch_sizes)}: {list(batch_sizes)}"
        )
    elif not batch_sizes:
        problems.append("batch_sizes: expected one entry per rank, got none")
    for r, b in enumerate(batch_sizes):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            problems.append(f"batch_sizes[{r}]: must be a whole number >= 1, got {b!r}")
    return problems


def servers_problems(servers: Any, world: int | None) -> list[str]:
    """What is wrong with ``servers`` as parameter-server ranks of ``world`` ranks (None: any), one line each."""
    if servers is None:
        return []
    if isinstance(servers, str | bytes) or not isinstance(servers, list | tuple) or not servers:
        return [f"servers: expected a non-empty list of ranks or null, got {servers!r}"]
    problems = []
    for i, r in enumerate(servers):
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or (world is not None and r >= world):
            below = "" if world is None else f" below {world}"
            problems.append(f"servers[{i}]: must be a rank >= 0{below}, got {r!r}")
    if len(set(servers)) != len(servers):
        problems.append(f"servers: ranks must be distinct, got {list(servers)}")
    return problems


def _task_to_dict(task: CommTask) -> dict[str, Any]:
    return {
        "id": task.id,
        "kind": task.kind,
        "name": task.name,
        "bytes": task.bytes,
        "priority": task.priority,
        "deps": list(task.deps),
        "transport": task.transport,
        "loss_bound": task.loss_bound,
        "segments": [[s.tensor, s.start, s.stop] for s in task.segments],
    }


def _task_from_dict(position: int, data: Any) -> CommTask:
    if not isinstance(data, dict):
        raise ValueError(f"tasks[{position}]: expected an object, got {type(data).__name__}")
    try:
        segments = tuple(Segment(int(t), int(a), int(b)) for t, a, b in data["segments"])
        return CommTask(
            id=int(data["id"]),
            kind=data["kind"],
            segments=segments,
            bytes=int(data["bytes"]),
            name=str(data["name"]),
            priority=int(data.get("priority", 0)),
            deps=tuple(int(d) for d in data.get("deps", ())),
            transport=str(data.get("transport", "collective")),
            loss_bound=float(data.get("loss_bound", 0.0)),
        )
    except KeyError as exc:
        raise ValueError(f"tasks[{position}].{exc.args[0]}: missing") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tasks[{position}]: {exc}") from None
