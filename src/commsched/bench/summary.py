"""The summaries of a ``commsched bench`` report: iteration times, percentiles and paired ratios of the runs.

Pure functions over the runs (the ranks' times, merged by
:mod:`commsched.bench.collect`), no processes and no files;
:func:`resummarise` recomputes a saved report with them.

Definitions (also written into the JSON, :data:`DEFINITIONS`):

* iteration time of a run = the slowest rank's mean time per timed
  iteration (forward + backward + ``optimizer.step()`` + ``zero_grad()``):
  (end of its last timed step − start of its first) / timed steps, warm-up
  dropped. A mean, not a median of steps: forward-mode policies move waiting
  between steps, so single steps vary while the throughput does not. A
  policy's time is the median over repeats, its spread the min and max;
* samples/s = workers × per-rank batch / iteration time;
* speed-up = median over repeats of the baseline's time / the policy's
  time in the same repeat (paired, so drift between repeats cancels), against
  ``torch_ddp``, default DDP (``ddp[25MiB]``: PyTorch's defaults) and best DDP
  (the grid configuration of the lowest median time in this session);
* max |Δparam| = largest absolute difference of any parameter from the
  ``torch_ddp`` run of the same repeat, on rank 0, after the last step;
* references: ``compute, world 1``: one rank alone in one namespace, no
  communication; ``compute, N in lock-step``: every rank trains its own
  replica at the same time, with a barrier after each step (the CPUs shared
  as in a real run, only the gradients not exchanged); ``all-reduce alone``:
  one gloo all-reduce of a buffer of all gradients; ideal overlap ≈
  max(compute N in lock-step, all-reduce alone); ``torch DDP, 1 MiB buckets``
  (``ddp[1MiB,find_unused]``): PyTorch DDP with smaller buckets, whose parameter
  difference from ``torch_ddp`` shows what reordering float sums alone does
  (with more than 2 ranks and BatchNorm on random data, ulp-level
  differences grow by orders of magnitude within a few steps).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from commsched.bench.baselines import BY_NAME, DEFAULT_DDP, LEGACY_YARDSTICK, YARDSTICK, best_ddp
from commsched.runtime import RUNTIME_POLICIES

REFERENCES = {
    "compute_alone": "compute, world 1",
    "compute": "compute, N in lock-step",
    "allreduce": "all-reduce alone",
    YARDSTICK: "torch DDP, 1 MiB buckets",
}
DEFINITIONS = {
    "iteration_time": "per run: the slowest rank's mean wall time per timed iteration (forward, backward, "
    "optimizer.step, zero_grad), i.e. (end of its last timed step - start of its first) / timed steps; "
    "per policy: median over repeats (spread: min-max over repeats)",
    "samples_per_s": "workers * per-rank batch / iteration time",
    "step_percentiles": "p50_ms, p90_ms, p99_ms: percentiles over every timed step of every repeat (steps: how "
    "many) of the step's wall time on the rank slowest at that step; a tail measure, where iteration_time is a "
    "mean (policies that move waiting from one step to the next spread wider here)",
    "phases_ms": "per run: median over ranks of the mean over timed steps of forward (model + loss), backward "
    "(loss.backward(), including any wait for gradients the policy makes there) and step (optimizer.step + "
    "zero_grad); per policy: median over repeats",
    "speedup": "median over repeats of torch_ddp's iteration time / the policy's, both of the same repeat "
    "(paired; speedup_min/max: over repeats); speedup_vs_default_ddp and speedup_vs_best_ddp (with _min/_max) "
    "the same against default DDP and best DDP",
    "ddp_grid": "PyTorch DDP with bucket_cap_mb in {1, 4, 25} x find_unused_parameters in {False, True}, named "
    "ddp[<cap>MiB] (False) and ddp[<cap>MiB,find_unused] (True), except torch_ddp = (25, True); "
    "default_ddp: ddp[25MiB] (PyTorch's defaults); best_ddp: the configuration of the lowest median "
    "iteration time in the session (only when all six ran)",
    "max_param_diff": "max |param - param of torch_ddp, same repeat| on rank 0 after the last step; "
    "for torch_ddp itself: vs its first repeat (run-to-run difference)",
    "min_param_moved": "min over repeats of max |final param - initial param| (training did change the model)",
    "replica_spread": "max over repeats of the spread between ranks of the float64 sum of all parameters",
    "compute_alone": "one rank, world size 1, alone in one namespace, no communication",
    "compute": "every rank trains its own replica with no gradient communication, all at the same time, "
    "with a barrier after every step (lock-step, as synchronous training shares the CPUs)",
    "allreduce": "one gloo all_reduce of a fp32 buffer with as many elements as the model has parameters",
    "ideal_overlap": "per repeat max(compute (N in lock-step), all-reduce alone); vs_ideal: median over repeats "
    "of the policy's time / that bound",
    YARDSTICK: "PyTorch DDP with bucket_cap_mb=1 (torch_ddp: 25), both find_unused_parameters=True: "
    "its max_param_diff is what "
    "reordering the gradient sums alone does to the parameters",
    "validation": "--validate: per session, the simulator's iteration time of each policy (calibrated before the "
    "policies ran: alpha-beta of gloo's all-reduce on the shaped links, rank 0's per-layer profile taken in "
    "lock-step with every rank, optimizer step time) beside the measured median; error_pct = (predicted - "
    "measured) / measured * 100; see commsched.bench.calibrate",
}


def _rank_iteration_ms(starts_s: list[float], times_s: list[float], warmup: int) -> float:
    """One rank's mean iteration time over the timed steps: (end of the last - start of the first) / steps."""
    return (starts_s[-1] + times_s[-1] - starts_s[warmup]) / (len(times_s) - warmup) * 1e3


def step_ms(run: dict[str, Any], warmup: int) -> list[float]:
    """A run's timed steps, each the time of its slowest rank, ms (``times_s`` holds every rank's steps)."""
    per_rank = run["times_s"]
    steps = min(len(ts) for ts in per_rank)
    return [max(ts[i] for ts in per_rank) * 1e3 for i in range(warmup, steps)]


def _summarise(runs: list[dict[str, Any]], workers: int, batch: int, warmup: int) -> dict[str, Any]:
    medians = [r["iteration_ms"] for r in runs]
    median_ms = statistics.median(medians)
    steps = [ms for r in runs for ms in step_ms(r, warmup)]
    p50, p90, p99 = np.percentile(steps, [50, 90, 99]) if steps else (np.nan,) * 3
    out: dict[str, Any] = {
        "median_ms": median_ms,
        "min_ms": min(medians),
        "max_ms": max(medians),
        "repeats": len(runs),
        "samples_per_s": workers * batch / (median_ms / 1e3),
        "steps": len(steps),
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
    }
    diffs = [r["max_param_diff"] for r in runs if r.get("max_param_diff") is not None]
    if diffs:
        out["max_param_diff"] = max(diffs)
    if all("phases_ms" in r for r in runs):
        out["phases_ms"] = {
            phase: statistics.median(r["phases_ms"][phase] for r in runs) for phase in runs[0]["phases_ms"]
        }
    moved = [r["max_param_moved"] for r in runs if r.get("max_param_moved") is not None]
    if moved:
        out["min_param_moved"] = min(moved)
    spreads = [r["replica_spread"] for r in runs if r.get("replica_spread") is not None]
    if spreads:
        out["replica_spread"] = max(spreads)
    return out


def _add_ratios(session: dict[str, Any], alone: dict[str, Any] | None) -> None:
    """Paired ratios: each repeat's run against torch_ddp, default and best DDP, and the bound of the same repeat.

    The machine's speed drifts between repeats (other work, scheduling); within a
    repeat all runs see nearly the same machine, so the median of per-repeat
    ratios is steadier than the ratio of medians. Best DDP is chosen first, by
    median over repeats, then paired like the others. Sets ``default_ddp`` and
    ``best_ddp`` (names) on the session where they were measured.
    """
    summary, runs = session["summary"], session["runs"]

    def by_repeat(name: str) -> dict[int, float]:
        return {r["repeat"]: r["iteration_ms"] for r in runs.get(name, [])}

    baselines = {"torch_ddp": "torch_ddp"}
    if DEFAULT_DDP.name in summary:
        session["default_ddp"] = baselines["default_ddp"] = DEFAULT_DDP.name
    best = best_ddp(summary)
    if best is not None:
        session["best_ddp"] = baselines["best_ddp"] = best
    compute, allreduce = by_repeat("compute"), by_repeat("allreduce")
    bound = {k: max(compute[k], allreduce[k]) for k in compute if k in allreduce}
    if bound:
        session["ideal_overlap_ms"] = statistics.median(bound.values())
    for name, s in summary.items():
        if name not in RUNTIME_POLICIES and name not in BY_NAME:
            continue
        mine = by_repeat(name)
        for key, baseline in baselines.items():
            theirs = by_repeat(baseline)
            speedups = [theirs[k] / ms for k, ms in mine.items() if k in theirs]
            if not speedups:
                continue
            s[f"speedup_vs_{key}"] = statistics.median(speedups)
            prefix = "speedup" if key == "torch_ddp" else f"speedup_vs_{key}"  # as named before the grid
            s[f"{prefix}_min"], s[f"{prefix}_max"] = min(speedups), max(speedups)
        vs_ideal = [ms / bound[k] for k, ms in mine.items() if k in bound]
        if vs_ideal:
            s["vs_ideal"] = statistics.median(vs_ideal)
    if alone is not None:
        session["compute_alone_ms"] = alone["summary"]["compute_alone"]["median_ms"]


def resummarise(report: dict[str, Any]) -> dict[str, Any]:
    """Recompute every summary and ratio of a saved report from its raw runs (after a change of definitions).

    Runs named as before the DDP grid are renamed (``torch_ddp_1mb`` is ``ddp[1MiB,find_unused]``).
    """
    config = report["meta"]["config"]
    workers, batch, warmup = config["workers"], config["batch"], config["warmup"]
    alone = report.get("compute_alone")
    if alone is not None:
        alone["summary"] = {name: _summarise(rs, 1, batch, warmup) for name, rs in alone["runs"].items()}
    for session in report["sessions"]:
        if LEGACY_YARDSTICK in session["runs"]:
            session["runs"] = {YARDSTICK if n == LEGACY_YARDSTICK else n: rs for n, rs in session["runs"].items()}
        session["summary"] = {name: _summarise(rs, workers, batch, warmup) for name, rs in session["runs"].items()}
        _add_ratios(session, alone)
    return report
