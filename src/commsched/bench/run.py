"""``commsched bench``: real data-parallel training on the testbed, every policy against default and best DDP.

For each link shaping (a *session*: one launch of the workers, one gloo group),
every policy and every PyTorch DDP configuration of the grid
(:mod:`commsched.bench.baselines`: ``bucket_cap_mb`` ∈ {1, 4, 25} ×
``find_unused_parameters`` ∈ {False, True}) trains ``repeats`` times from the
same seed on the same synthetic data, ``warmup + iters`` iterations each; they
alternate within a repeat so that slow drifts of the machine hit them alike.

Definitions (also written into the JSON):

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

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commsched.bench.baselines import BY_NAME, DEFAULT_DDP, LEGACY_YARDSTICK, YARDSTICK, best_ddp
from commsched.bench.calibrate import load_calibration, predict_session, save_inputs
from commsched.bench.calibrate_task import calibration_sizes
from commsched.bench.worker import session_order
from commsched.models import MODELS, build_model, parameter_count
from commsched.runtime import RUNTIME_POLICIES
from commsched.runtime.switching import auto_settles_after
from commsched.runtime.warmup import WARMUP_ITERS
from commsched.schedule import AUTO
from commsched.testbed.commands import LinkShape
from commsched.testbed.launch import run_workers
from commsched.testbed.netns import Isolation, NetnsTestbed, Testbed, TestbedError, open_testbed
from commsched.testbed.probe import probe_link
from commsched.trace import Trace

DEFAULT_POLICIES = tuple(RUNTIME_POLICIES)
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


#: Untimed iterations a commsched policy needs: it profiles its warm-up iterations, then switches to its plan.
MIN_WARMUP = WARMUP_ITERS + 1
#: Iterations before ``auto`` runs the plan it keeps, at most (after its trials: its choice, the runner-up and,
#: when both seem slower than the warm-up, the warm-up's plan).
AUTO_WARMUP = auto_settles_after(WARMUP_ITERS)


@dataclass(frozen=True)
class BenchConfig:
    model: str = "resnet5m"
    workers: int = 4
    shapes: tuple[LinkShape, ...] = (LinkShape(),)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    iters: int = 10
    warmup: int = 3
    repeats: int = 3
    batch: int = 8
    threads: int = 1
    seed: int = 0
    lr: float = 0.01
    comm_timeout_s: float = 60.0
    references: bool = True
    ddp_grid: bool = True
    probe: bool = True
    validate: bool = False
    isolation: Isolation = "auto"
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    fail: Mapping[str, Any] | None = None  # make one rank die (tests of the failure path)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; known: {', '.join(MODELS)}")
        unknown = [p for p in self.policies if p not in RUNTIME_POLICIES]
        if unknown or not self.policies:
            raise ValueError(
                f"policies: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(RUNTIME_POLICIES)}"
            )
        if self.workers < 2:
            raise ValueError(f"workers: data parallelism needs at least 2, got {self.workers!r}")
        for name, value in (
            ("iters", self.iters),
            ("repeats", self.repeats),
            ("batch", self.batch),
            ("threads", self.threads),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value!r}")
        if self.warmup < MIN_WARMUP and any(p != "torch_ddp" for p in self.policies):
            raise ValueError(
                f"warmup: commsched policies profile for 2 iterations and switch plans; need >= {MIN_WARMUP}, "
                f"got {self.warmup}"
            )
        if not self.shapes:
            raise ValueError("shapes: need at least one link shaping")

    def notes(self) -> list[str]:
        """What a reader of this configuration's results should know (nothing wrong with it)."""
        if AUTO in self.policies and self.warmup < AUTO_WARMUP:
            return [
                f"auto measures its choice and the runner-up (and, if both seem slower, the warm-up's plan) before "
                f"it keeps one ({AUTO_WARMUP} iterations at most); "
                f"with --warmup {self.warmup} its timed iterations include those trials "
                f"(--warmup {AUTO_WARMUP} times only the plan it keeps)"
            ]
        return []


# ------------------------------------------------------------------ reporting helpers


def source_info() -> dict[str, Any]:
    """The commit of the checkout commsched runs from, and its modified files (results depend on both)."""
    root = Path(__file__).resolve().parents[3]
    info: dict[str, Any] = {}
    for key, argv in (("commit", ["git", "rev-parse", "HEAD"]), ("modified", ["git", "status", "--porcelain", "-uno"])):
        try:
            out = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        info[key] = out.strip() if key == "commit" else [line[3:] for line in out.splitlines()]
    return info


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
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
        for key in ("max_param_diff", "max_param_abs", "max_param_moved", "replica_spread", "plan", "trials"):
            if key in run0:
                run[key] = run0[key]
        if "thread_cpu_ms" in run0:  # per rank: CPU ms per timed iteration of each thread name
            run["thread_cpu_ms"] = [r.get("thread_cpu_ms") for r in per_rank]
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


# ------------------------------------------------------------------ the run


class _ProgressTail:
    """Reads the ``progress.jsonl`` rank 0 appends to; notices when it stops growing."""

    def __init__(self, path: Path, on_step: Callable[[dict[str, Any]], None], stall_s: float) -> None:
        self.path = path
        self.on_step = on_step
        self.stall_s = stall_s
        self.offset = 0
        self.last_change = time.monotonic()

    def __call__(self) -> None:
        if self.path.exists():
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                self.on_step(json.loads(line))
                self.last_change = time.monotonic()
        if time.monotonic() - self.last_change > self.stall_s:
            raise TestbedError(
                f"no iteration finished on rank 0 for {self.stall_s:g} s: a worker hung; logs in {self.path.parent}"
            )


def _launch(
    bed: Testbed,
    job: dict[str, Any],
    session_dir: Path,
    *,
    ranks: Sequence[int] | None,
    launch: int,
    on_step: Callable[[dict[str, Any]], None],
    config: BenchConfig,
    steps: int,
) -> None:
    """Run one job on the testbed; ``steps`` is every iteration it runs (bounds its wall time)."""
    session_dir.mkdir(parents=True, exist_ok=True)
    job_path = session_dir / "job.json"
    job_path.write_text(json.dumps(job))
    stall_s = config.comm_timeout_s + 120.0  # a first iteration includes start-up and profiling
    tail = _ProgressTail(session_dir / "progress.jsonl", on_step, stall_s)
    run_workers(
        bed,
        [sys.executable, "-m", "commsched.bench.worker", str(job_path)],
        log_dir=session_dir / "logs",
        # A backstop only: a hang is caught much earlier by the progress tail.
        timeout_s=300.0 + steps * max(30.0, config.comm_timeout_s / 2),
        ranks=ranks,
        name=job["task"],
        launch=launch,
        fail_grace_s=min(config.comm_timeout_s, 15.0) + 5.0,
        poll=tail,
        extra_env={"OMP_NUM_THREADS": str(config.threads)},
    )


def run_bench(
    config: BenchConfig,
    out_dir: Path,
    *,
    command_line: str = "",
    log: Callable[[str], None] | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Run every session of ``config``; write ``bench.json`` (+ traces) under ``out_dir``; return the report.

    ``progress`` is a ``rich.progress.Progress`` (or None); ``log`` prints messages.
    """
    say = log or (lambda message: print(message, file=sys.stderr, flush=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    machine = machine_info()
    numel = parameter_count(build_model(config.model, config.seed))
    report: dict[str, Any] = {
        "meta": {
            "command_line": command_line,
            "machine": machine,
            "source": source_info(),
            "config": {**asdict(config), "shapes": [asdict(s) for s in config.shapes]},
            "model_parameters": numel,
            "gradient_mib": numel * 4 / 2**20,
            "definitions": DEFINITIONS,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        },
        "sessions": [],
    }
    shapes = list(config.shapes)
    with open_testbed(config.workers, isolation=config.isolation, log=say) as bed:
        report["meta"]["testbed"] = {"isolation": bed.isolation, "description": bed.describe()}
        if not isinstance(bed, NetnsTestbed):
            skipped = [s.label for s in shapes if s.shaped]
            shapes = [s for s in shapes if not s.shaped]
            if skipped:
                say(f"bench: cannot shape links without namespaces; skipping {', '.join(skipped)}")
            if not shapes:
                raise TestbedError("bench: nothing left to run: every requested shaping needs the namespace testbed")
        steps = config.warmup + config.iters
        runs_per_repeat = len(
            session_order(list(config.policies), 0, references=config.references, ddp_grid=config.ddp_grid)
        ) + (2 if config.references else 0)
        per_session = config.repeats * steps * runs_per_repeat
        calibrate_steps = len(calibration_sizes(numel)) + 1 + 2 * steps if config.validate else 0
        total = len(shapes) * (per_session + calibrate_steps) + (config.repeats * steps if config.references else 0)
        progress_task = progress.add_task("starting", total=total) if progress is not None else None

        def advance(description: str, repeats: bool) -> Callable[[dict[str, Any]], None]:
            def on_step(step: dict[str, Any]) -> None:
                if progress is not None:
                    repeat = f" repeat {step['repeat'] + 1}/{config.repeats}" if repeats else ""
                    progress.update(progress_task, advance=1, description=f"{description}: {step['name']}{repeat}")

            return on_step

        job_base = {
            "model": config.model,
            "batch": config.batch,
            "iters": config.iters,
            "warmup": config.warmup,
            "repeats": config.repeats,
            "seed": config.seed,
            "lr": config.lr,
            "threads": config.threads,
            "comm_timeout_s": config.comm_timeout_s,
        }
        launch = 0

        def run_job(
            task: str, directory: Path, label: str, steps: int, ranks: list[int] | None = None, **fields: Any
        ) -> None:
            """One launch of the workers on ``task``; ``steps`` bounds its wall time and drives the progress bar."""
            nonlocal launch
            job = {**job_base, "task": task, "out": str(directory), **fields}
            on_step = advance(label, repeats=task != "calibrate")
            if progress is not None:  # ends the previous phase (a plain progress line) before the launch
                progress.update(progress_task, description=f"{label}: starting the workers")
            _launch(bed, job, directory, ranks=ranks, launch=launch, on_step=on_step, config=config, steps=steps)
            launch += 1

        if config.references:
            bed.set_shape(LinkShape())
            alone_dir = out_dir / "compute_alone"
            run_job("compute_alone", alone_dir, "world 1", config.repeats * steps, ranks=[0])
            alone = _collect(alone_dir, 1, config.warmup, config.batch)
            report["compute_alone"] = alone
        knobs = {k: dict(v) for k, v in config.knobs.items()}
        for shape in shapes:
            bed.set_shape(shape)
            session: dict[str, Any] = {"shape": asdict(shape), "label": shape.label, "load_average": os.getloadavg()}
            if isinstance(bed, NetnsTestbed):
                session["qdiscs"] = bed.qdiscs()
            session_dir = out_dir / f"session-{_slug(shape.label)}"
            if config.probe:
                session["link_check"] = probe_link(bed, session_dir / "logs", launch=launch)
                launch += 1
            calibration = None
            if config.validate:
                calibration_dir = session_dir / "calibrate"
                run_job("calibrate", calibration_dir, f"{shape.description} calibrating", calibrate_steps)
                calibration = load_calibration(calibration_dir)
                session["calibration"] = calibration.data  # raw, so a saved report can be re-validated
                session["calibration_files"] = save_inputs(calibration, out_dir / f"calibration-{_slug(shape.label)}")
            run_job(
                "session",
                session_dir,
                shape.description,
                per_session,
                policies=list(config.policies),
                knobs=knobs,
                references=config.references,
                ddp_grid=config.ddp_grid,
                fail=dict(config.fail) if config.fail else None,
            )
            session["load_average_end"] = os.getloadavg()
            session.update(_collect(session_dir, config.workers, config.warmup, config.batch))
            _add_ratios(session, report.get("compute_alone"))
            if calibration is not None:
                session["validation"] = predict_session(session, calibration, list(config.policies), knobs)
            session["traces"] = merge_traces(
                session_dir, out_dir, shape.label, config.workers, {"model": config.model, "batch": config.batch}
            )
            report["sessions"].append(session)
            _write(report, out_dir, complete=False)  # what is done survives a later failure
    report["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["meta"]["wall_s"] = time.time() - started
    report["meta"]["load_average_end"] = os.getloadavg()
    report["meta"]["source_end"] = source_info()
    _write(report, out_dir, complete=True)
    return report


def _write(report: dict[str, Any], out_dir: Path, *, complete: bool) -> None:
    report["meta"]["complete"] = complete
    tmp = out_dir / "bench.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(out_dir / "bench.json")


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
