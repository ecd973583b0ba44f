"""The Trace: one schema for what the simulator predicts and what the runtime measures.

Each :class:`TraceEvent` is one interval on one worker: a layer's forward or
backward, an update, or a communication task. Simulated and measured traces
of the same plan share task names, so they can be compared task by task
(``commsched compare --measured``).

``kind`` is one of ``forward``, ``backward``, ``update``, ``all_reduce``,
``reduce_scatter``, ``all_gather``, ``wait`` (compute blocked on communication).
Times are seconds from the start of the run.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

COMM_KINDS = frozenset({"all_reduce", "reduce_scatter", "all_gather", "push", "pull"})
COMPUTE_KINDS = frozenset({"forward", "backward", "update"})


@dataclass(frozen=True, slots=True)
class TraceEvent:
    task: str
    kind: str
    worker: int
    start_s: float
    end_s: float
    bytes: int = 0
    iteration: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Trace:
    """Events plus what produced them (``meta``: policy, model, cluster, source=simulated|measured)."""

    events: list[TraceEvent] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, event: TraceEvent) -> None:
        self.events.append(event)

    # ---- summaries ----

    def iteration_bounds(self, worker: int = 0) -> dict[int, tuple[float, float]]:
        """First start and last end of each iteration's events on ``worker``."""
        bounds: dict[int, tuple[float, float]] = {}
        for e in self.events:
            if e.worker != worker:
                continue
            lo, hi = bounds.get(e.iteration, (e.start_s, e.end_s))
            bounds[e.iteration] = (min(lo, e.start_s), max(hi, e.end_s))
        return dict(sorted(bounds.items()))

    def task_durations(self) -> dict[tuple[str, str], float]:
        """Median duration per (kind, task) over iterations and workers."""
        groups: dict[tuple[str, str], list[float]] = defaultdict(list)
        for e in self.events:
            groups[(e.kind, e.task)].append(e.duration_s)
        return {k: median(v) for k, v in groups.items()}

    # ---- files ----

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "events": [asdict(e) for e in self.events]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace saved by :meth:`save` or :meth:`save_chrome`, gzipped where its name ends in ``.gz``."""
        path = Path(path)
        data = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
        if "traceEvents" in data:  # a Chrome trace written by to_chrome
            data = data.get("commsched", {})
        return cls([TraceEvent(**e) for e in data.get("events", [])], dict(data.get("meta", {})))

    def to_chrome(self) -> dict[str, Any]:
        """Chrome/Perfetto JSON: one process per worker, compute and communication on separate rows.

        The native events ride along under ``commsched`` so the file loads back losslessly.
        """
        out = []
        for e in self.events:
            tid = "communication" if e.kind in COMM_KINDS else "compute"
            out.append(
                {
                    "name": e.task,
                    "cat": e.kind,
                    "ph": "X",
                    "pid": e.worker,
                    "tid": tid,
                    "ts": e.start_s * 1e6,
                    "dur": max(e.duration_s, 0.0) * 1e6,
                    "args": {"bytes": e.bytes, "iteration": e.iteration},
                }
            )
        return {"traceEvents": out, "displayTimeUnit": "ms", "commsched": self.to_dict()}

    def save_chrome(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_chrome()) + "\n")
