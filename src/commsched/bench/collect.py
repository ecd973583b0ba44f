"""What the ranks of one launch wrote, merged: results into runs and summaries, traces into one file per policy."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from commsched.bench.summary import _rank_iteration_ms, _summarise
from commsched.bench.threads import READINGS
from commsched.trace import Trace


def _collect(session_dir: Path, world: int, warmup: int, batch: int) -> dict[str, Any]:
    """Merge the ranks' files into runs (per name, per repeat) and summaries."""
    ranks = [json.loads((session_dir / f"rank{r}.json").read_text()) for r in range(world)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for i, run0 in enumerate(ranks[0]["runs"]):
        per_rank = [rk["runs"][i] for rk in ranks]
        rank_ms = [_rank_iteration_ms(r["starts_s"], r["times_s"], warmup) for r in per_rank]
        run = {
            "repeat": run0["repeat"],
            "times_s": [r["times_s"] for r in per_rank],
            "starts_s": [r["starts_s"] for r in per_rank],
            "rank_iteration_ms": rank_ms,
            "iteration_ms": max(rank_ms),
        }
        if per_rank[0].get("phases_s"):
            run["phases_ms"] = {
                phase: statistics.median(statistics.fmean(r["phases_s"][phase][warmup:]) * 1e3 for r in per_rank)
                for phase in per_rank[0]["phases_s"]
            }
        for key in ("max_param_diff", "max_param_abs", "max_param_moved", "replica_spread", "plan", "trials", "again"):
            if key in run0:
                run[key] = run0[key]
        # per rank, per timed iteration of each thread name: its CPU and its wait for a core (ms), its sleeps
        for key in READINGS:
            if key in run0:
                run[key] = [r.get(key) for r in per_rank]
        runs.setdefault(run0["name"], []).append(run)
    summary = {
        name: _summarise(rs, world if name != "compute_alone" else 1, batch, warmup) for name, rs in runs.items()
    }
    return {"runs": runs, "summary": summary, "threads": ranks[0].get("threads")}


def merge_traces(session_dir: Path, out_dir: Path, label: str, world: int, meta: dict[str, Any]) -> dict[str, str]:
    """One Chrome/Perfetto file per policy with every rank (each rank's clock starts at its engine):
    ``trace-<label>-<policy>.json`` (``trace-<policy>.json`` where ``label`` is empty)."""
    files: dict[str, str] = {}
    trace_dir = session_dir / "traces"
    if not trace_dir.is_dir():
        return files
    policies = sorted({p.name.split(".rank")[0] for p in trace_dir.glob("*.rank*.json")})
    for policy in policies:
        merged = Trace(meta={**meta, "policy": policy, "source": "measured", "shaping": label})
        for r in range(world):
            part = trace_dir / f"{policy}.rank{r}.json"
            if part.exists():
                merged.events.extend(Trace.load(part).events)
                part.unlink()
        path = out_dir / (f"trace-{_slug(label)}-{policy}.json" if label else f"trace-{policy}.json")
        merged.save_chrome(path)
        files[policy] = path.name
    return files


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
