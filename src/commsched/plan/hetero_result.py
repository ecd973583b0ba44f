"""What :func:`commsched.plan.hetero.plan_heterogeneous` returns: the plan and the baselines beside it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from commsched.plan.memory import RankMemory
from commsched.plan.search import Simulated
from commsched.schedule import CommPlan
from commsched.sim.result import SimResult

#: The policy and knobs every baseline runs: PyTorch DDP at its defaults.
BASELINE_POLICY = "ddp"


@dataclass(frozen=True)
class Baseline(Simulated):
    """A plan a user would run without a planner, simulated beside the plan."""

    name: str
    batch_sizes: tuple[int, ...]
    sync: str
    result: SimResult = field(repr=False)
    fits: bool
    memory_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policy": BASELINE_POLICY,
            "sync": self.sync,
            "batch_sizes": list(self.batch_sizes),
            "iteration_ms": self.iteration_ms,
            "samples_per_s": self.samples_per_s,
            "fits": self.fits,
            "memory_note": self.memory_note,
        }


@dataclass(frozen=True)
class HeteroPlan(Simulated):
    """The chosen plan: per-rank batches, policy and knobs, per-bucket transport; baselines beside it."""

    model: str
    cluster: str
    global_batch: int
    batch_sizes: tuple[int, ...]
    policy: str
    knobs: dict[str, Any]
    sync: str
    result: SimResult = field(repr=False)
    baselines: tuple[Baseline, ...]
    memory: tuple[RankMemory, ...]
    #: "search", or "baseline:NAME" when no searched plan beat that baseline
    chosen: str
    splits_screened: int
    splits_searched: int
    simulations: int
    search_s: float
    budget_s: float
    #: whether the budget cut the search short (a split, a knob trial or a final simulation skipped)
    budget_exhausted: bool = False
    notes: tuple[str, ...] = ()
    #: the ranks that run the parameter servers of the plan's PS tasks (None: every rank, or no PS task)
    servers: tuple[int, ...] | None = None
    #: every batch a multiple of it, accumulated in micro-batches of this size (None: one pass per step)
    micro_batch: int | None = None

    @cached_property
    def plan(self) -> CommPlan:
        """The simulated CommPlan carrying this plan's per-rank batches (``batch_sizes``), parameter-server
        ranks (``servers``) and micro-batch: what :meth:`save` writes and ``parallelize(model, optimizer,
        plan=...)`` runs."""
        return replace(super().plan, batch_sizes=self.batch_sizes, servers=self.servers, micro_batch=self.micro_batch)

    @property
    def transports(self) -> tuple[str, ...]:
        """Per task of the plan: ``"collective"`` or ``"ps"``."""
        return tuple(t.transport for t in self.plan.tasks)

    def baseline(self, name: str) -> Baseline:
        for b in self.baselines:
            if b.name == name:
                return b
        raise KeyError(name)

    def speedup_over(self, name: str = "even_allreduce") -> float:
        """Baseline iteration time / this plan's (1.3 = 30 % faster)."""
        return self.baseline(name).iteration_ms / self.iteration_ms

    def ranks(self) -> list[dict[str, Any]]:
        """Per rank: device, local batch and the weight ``b_i/B`` the runtime gives its gradient."""
        return [
            {
                "rank": m.rank,
                "device": m.device,
                "node": m.node,
                "local_batch": b,
                "gradient_weight": b / self.global_batch,
                "memory_used_bytes": m.used_bytes,
                "memory_usable_bytes": m.usable_bytes,
            }
            for m, b in zip(self.memory, self.batch_sizes, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "cluster": self.cluster,
            "global_batch": self.global_batch,
            "chosen": self.chosen,
            "policy": self.policy,
            "knobs": self.knobs,
            "sync": self.sync,
            "iteration_ms": self.iteration_ms,
            "samples_per_s": self.samples_per_s,
            "batch_sizes": list(self.batch_sizes),
            "ranks": self.ranks(),
            "buckets": [
                {"task": t.id, "name": t.name, "kind": t.kind, "bytes": t.bytes, "transport": t.transport}
                for t in self.plan.tasks
            ],
            "baselines": [b.to_dict() for b in self.baselines],
            "servers": None if self.servers is None else list(self.servers),
            "micro_batch": self.micro_batch,
            "speedup_over_even_allreduce": self.speedup_over("even_allreduce"),
            "splits_screened": self.splits_screened,
            "splits_searched": self.splits_searched,
            "simulations": self.simulations,
            "search_s": self.search_s,
            "budget_s": self.budget_s,
            "budget_exhausted": self.budget_exhausted,
            "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> Path:
        """Write the CommPlan, per-rank batches included (:attr:`plan`), to ``path``; returns it."""
        path = Path(path)
        self.plan.save(path)
        return path
