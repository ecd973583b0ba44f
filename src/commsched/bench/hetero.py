"""``commsched bench --plan``: a heterogeneous plan against the data-parallel baselines, measured side by side.

The testbed (:class:`~commsched.testbed.HeteroTestbed`): one network namespace
per worker, each worker in a cgroup of its own (cores and a CPU quota per
10 ms period) and on a link of its own rate. The default is the setup of
``docs/planning.md``: 3 workers on 2 cores, A alone on the first core at
100 %, B and C on the second at 25 % each, links 3:1:1 (3, 1, 1 Gbit/s).

A run, all on that testbed:

1. **measure** (:mod:`commsched.bench.hetero_spec`): each worker's link rate
   on its own, gloo's collectives over the shaped links, every rank's
   per-layer profile under its own quota (in lock-step), the optimizer step;
   they make the cluster spec and workload the planner sees, written to
   ``measured/cluster.yaml`` and ``measured/workload.json``;
2. **plan**: ``--plan auto`` runs the planner of ``commsched plan`` on that
   spec (the equivalent command is recorded); ``--plan FILE`` takes a plan
   file as it is (its per-rank batches fix the global batch);
3. **run** (:mod:`commsched.bench.hetero_worker`): even DP with default DDP,
   speed-proportional DP with the runtime's ring all-reduce, and the plan,
   ``repeats`` times each, alternating; the simulator's prediction of each on
   the measured spec is set beside the measurement. Beside them, for
   reference, the plan's compute alone (its batches, no communication, the
   ranks in lock-step) against the simulator's compute of the slowest rank:
   how much of a prediction's error is compute's. The runtime's first repeat
   of each configuration is traced (``trace-<config>.json``), the simulator's
   run of the plan beside it (``trace-plan-predicted.json``), both for
   Perfetto or :func:`commsched.trace.compare_traces`. Every repeat starts
   with every rank timing forward + backward at the calibration's batch: the
   host's compute speed then, for a second prediction of every configuration
   at the runs' speed (:mod:`commsched.bench.drift`).

Definitions (also in ``hetero.json``): a run's iteration time is the slowest
rank's mean over the timed iterations (warm-up dropped); a configuration's
is the median over repeats; a speed-up is the median over repeats of the
baseline's time over the configuration's in the same repeat (paired);
``error_pct = (predicted - measured) / measured × 100``; ``error_at_run_pct``
the same for the prediction at the runs' speed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from commsched.bench.baselines import DEFAULT_DDP
from commsched.bench.batch_curve import CURVE_REPEATS
from commsched.bench.calibrate_task import calibration_sizes
from commsched.bench.collect import merge_traces
from commsched.bench.drift import factors_by_batch, speed_factors
from commsched.bench.hetero_spec import MeasuredSpec, measured_spec, plan_command, runnable_policies
from commsched.bench.hetero_worker import CONFIGS, REFERENCES
from commsched.bench.overlap import OVERLAP_REPEATS
from commsched.bench.provenance import machine_info, source_info
from commsched.models import MODELS, build_model, parameter_count
from commsched.plan.batches import even_split, proportional_split
from commsched.plan.hetero import plan_heterogeneous
from commsched.plan.memory import GIB
from commsched.schedule import CommPlan
from commsched.schedule import knobs as policy_knobs
from commsched.testbed import CpuShare, HeteroTestbed, LinkShape, NetnsTestbed, run_workers
from commsched.testbed.linkrate import probe_worker_links
from commsched.trace import Trace

#: A alone on the first core; B and C on the second at a quarter of it each.
DEFAULT_CPU = (CpuShare(cpus=(0,)), CpuShare(cpus=(1,), quota=0.25), CpuShare(cpus=(1,), quota=0.25))
#: Per-worker links 3:1:1.
DEFAULT_LINKS = (LinkShape(rate_bps=3 * 10**9), LinkShape(rate_bps=10**9), LinkShape(rate_bps=10**9))
LABELS = {
    "even_ddp": "even DP (default DDP)",
    "proportional_dp": "speed-proportional DP (ring all-reduce)",
    "plan": "plan",
    "plan_compute": "plan's compute alone (reference)",
}
DEFINITIONS = {
    "iteration_ms": "per run: the slowest rank's mean wall time per timed iteration; per configuration: median "
    "over repeats (min/max over repeats)",
    "speedup_vs_X": "median over repeats of X's iteration time / this configuration's, same repeat",
    "predicted_ms": "the simulator on the measured spec (measured/cluster.yaml, measured/workload.json) with the "
    "runtime's gloo options, the measured optimizer step and communication CPU work",
    "error_pct": "(predicted - measured) / measured * 100",
    "predicted_at_run_ms": "median over repeats of the same simulation with every rank's compute scaled by its "
    "speed factor in that repeat: its forward + backward at the profile batch, timed before the repeat's "
    "configurations, over the calibration's",
    "error_at_run_pct": "(predicted_at_run - measured) / measured * 100",
    "plan_compute": "the plan's batches with no gradient communication, a barrier after every step; predicted: "
    "the simulator's compute time of the slowest rank in the plan's run",
    "max_param_diff": "max |param - param of even_ddp, same repeat| on rank 0 after the last step (BatchNorm "
    "statistics are per rank, so uneven splits differ by design on models with BatchNorm)",
}


@dataclass(frozen=True)
class HeteroBenchConfig:
    """What ``commsched bench --plan`` measures; the defaults are the 3-worker setup of the module docstring."""

    plan: str = "auto"
    model: str = "resnet5m"
    cpu: tuple[CpuShare, ...] = DEFAULT_CPU
    links: tuple[LinkShape, ...] = DEFAULT_LINKS
    global_batch: int = 48
    iters: int = 10
    warmup: int = 3
    repeats: int = 3
    threads: int = 1
    seed: int = 0
    lr: float = 0.01
    comm_timeout_s: float = 60.0
    budget_s: float = 10.0
    memory_gib: float = field(default_factory=lambda: _machine_memory_gib())

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if len(self.cpu) != len(self.links) or len(self.cpu) < 2:
            raise ValueError(
                f"cpu: one share per worker link and at least 2 workers, got {len(self.cpu)} shares "
                f"for {len(self.links)} links"
            )
        for name in ("iters", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")
        if self.warmup < 3:
            raise ValueError(f"warmup: the runtime profiles 2 iterations before its plan; need >= 3, got {self.warmup}")
        if self.global_batch < len(self.cpu):
            raise ValueError(f"global_batch: at least one sample per worker ({len(self.cpu)}), got {self.global_batch}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be > 0, got {self.budget_s!r}")

    @property
    def workers(self) -> int:
        return len(self.cpu)


def _machine_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def batch_sizes(spec: MeasuredSpec, plan: CommPlan, global_batch: int) -> dict[str, list[int]]:
    """Per configuration, per rank: even, ∝ measured speed (largest remainder), the plan's own (its compute
    alone too)."""
    n = spec.cluster.num_workers
    planned = plan.batch_sizes or even_split(global_batch, n)
    return {
        "even_ddp": list(even_split(global_batch, n)),
        "proportional_dp": list(proportional_split(global_batch, spec.speeds)),
        "plan": list(planned),
        "plan_compute": list(planned),
    }


def predictions(
    spec: MeasuredSpec, plan: CommPlan, sizes: dict[str, list[int]], *, trace: bool = True
) -> tuple[dict[str, float], Trace | None]:
    """The simulator's iteration time of each configuration on the measured spec (the plan's compute alone
    too), and its trace of the plan (with ``trace``)."""
    _, ddp_knobs = DEFAULT_DDP.simulated_as
    planned = spec.simulate_plan(plan, trace=trace)
    if planned.trace is not None:  # a timeline per worker class, named by its lowest rank
        planned.trace.meta["classes"] = [list(c.ranks) for c in planned.classes]
    predicted = {
        "even_ddp": spec.predict_ms("ddp", {**policy_knobs("ddp"), **ddp_knobs}, sizes["even_ddp"]),
        "proportional_dp": spec.predict_ms("ddp", policy_knobs("ddp"), sizes["proportional_dp"]),
        "plan": planned.iteration_ms,
        "plan_compute": planned.compute_ms,
    }
    return predicted, planned.trace


def predictions_at_run_speed(
    spec: MeasuredSpec,
    plan: CommPlan,
    sizes: dict[str, list[int]],
    factors: Sequence[Sequence[float | Mapping[int, float]]],
) -> dict[str, float]:
    """Per configuration, the median over repeats of :func:`predictions` on the spec rescaled by that repeat's
    speed factors (:func:`commsched.bench.drift.speed_factors`, or per batch:
    :func:`commsched.bench.drift.factors_by_batch`); empty without factors."""
    batches = {b for per_rank in sizes.values() for b in per_rank}
    per_repeat = [predictions(spec.rescaled(row, batches), plan, sizes, trace=False)[0] for row in factors]
    return {name: statistics.median(p[name] for p in per_repeat) for name in per_repeat[0]} if per_repeat else {}


def summarise(
    rank_files: list[dict[str, Any]],
    warmup: int,
    predicted: dict[str, float],
    at_run_speed: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Per configuration: measured median/min/max, paired speed-ups, prediction errors (at the calibration's
    speed and, where given, at the runs'), parameter difference."""
    by_repeat: dict[str, dict[int, float]] = {}
    diffs: dict[str, list[float]] = {}
    for i, run0 in enumerate(rank_files[0]["runs"]):
        per_rank = [rk["runs"][i] for rk in rank_files]
        ms = max(
            (r["starts_s"][-1] + r["times_s"][-1] - r["starts_s"][warmup]) / (len(r["times_s"]) - warmup) * 1e3
            for r in per_rank
        )
        by_repeat.setdefault(run0["name"], {})[run0["repeat"]] = ms
        if "max_param_diff" in run0:
            diffs.setdefault(run0["name"], []).append(run0["max_param_diff"])
    out: dict[str, Any] = {}
    for name, repeats in by_repeat.items():
        values = list(repeats.values())
        median = statistics.median(values)
        row: dict[str, Any] = {
            "median_ms": median,
            "min_ms": min(values),
            "max_ms": max(values),
            "repeats": len(values),
        }
        for base in ("even_ddp", "proportional_dp"):
            theirs = by_repeat.get(base, {})
            paired = [theirs[k] / v for k, v in repeats.items() if k in theirs]
            if paired and name != base and name not in REFERENCES:
                row[f"speedup_vs_{base}"] = statistics.median(paired)
        if name in predicted:
            row["predicted_ms"] = predicted[name]
            row["error_pct"] = (predicted[name] - median) / median * 100
        if at_run_speed and name in at_run_speed:
            row["predicted_at_run_ms"] = at_run_speed[name]
            row["error_at_run_pct"] = (at_run_speed[name] - median) / median * 100
        if name in diffs and name not in REFERENCES:
            row["max_param_diff"] = max(diffs[name])
        out[name] = row
    return out


def _launch(
    bed: HeteroTestbed,
    argv_module: str,
    job: dict[str, Any],
    directory: Path,
    launch: int,
    steps: int,
    tick: Callable[[], None],
) -> list[dict[str, Any]]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "job.json").write_text(json.dumps(job))
    run_workers(
        bed,
        [sys.executable, "-m", argv_module, str(directory / "job.json")],
        log_dir=directory / "logs",
        timeout_s=300.0 + steps * max(30.0, job["comm_timeout_s"] / 2),
        name=job.get("task", "hetero"),
        launch=launch,
        fail_grace_s=min(job["comm_timeout_s"], 15.0) + 5.0,
        poll=tick,
        extra_env={"OMP_NUM_THREADS": str(job["threads"])},
    )
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(bed.workers)]


def run_hetero_bench(
    config: HeteroBenchConfig,
    out_dir: Path,
    *,
    command_line: str = "",
    log: Callable[[str], None] | None = None,
    tick: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Measure, plan and run (module docstring); write ``hetero.json`` under ``out_dir`` and return the report."""
    say = log or (lambda message: print(message, file=sys.stderr, flush=True))
    poll = tick or (lambda: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    n = config.workers
    report: dict[str, Any] = {
        "meta": {
            "command_line": command_line,
            "machine": machine_info(),
            "source": source_info(),
            "config": {
                **asdict(config),
                "cpu": [asdict(c) for c in config.cpu],
                "links": [asdict(s) for s in config.links],
            },
            "model_parameters": parameter_count(build_model(config.model, config.seed)),
            "definitions": DEFINITIONS,
        }
    }
    base = {
        "model": config.model,
        "iters": config.iters,
        "warmup": config.warmup,
        "seed": config.seed,
        "threads": config.threads,
        "comm_timeout_s": config.comm_timeout_s,
        "lr": config.lr,
    }
    with HeteroTestbed(NetnsTestbed(n, log=say), cpu=config.cpu, links=config.links, log=say) as bed:
        report["meta"]["testbed"] = bed.describe()
        say(f"bench --plan: measuring the testbed ({bed.describe()})")
        links = probe_worker_links(bed, out_dir / "logs", [s.rate_bps for s in config.links])
        profile_batch = max(1, config.global_batch // n)
        numel = report["meta"]["model_parameters"]
        calibrate = {
            **base,
            "task": "calibrate",
            "out": str(out_dir / "calibrate"),
            "batch": profile_batch,
            "repeats": 1,
            "curve_global_batch": config.global_batch,
            "overlap": True,
        }
        steps = len(calibration_sizes(numel)) + 1 + 2 * (config.warmup + config.iters)
        steps += 2 + CURVE_REPEATS + OVERLAP_REPEATS + 3 * (2 + OVERLAP_REPEATS)  # the last: three task layouts
        ranks = _launch(bed, "commsched.bench.worker", calibrate, out_dir / "calibrate", 0, steps, poll)
        spec = measured_spec(ranks, links, memory_gib=config.memory_gib / n, name="testbed (measured)")
        measured_dir = out_dir / "measured"
        measured_dir.mkdir(exist_ok=True)
        spec.workload.save(measured_dir / "workload.json")
        spec.cluster.save(measured_dir / "cluster.yaml")
        report["measured"] = {
            "links": [asdict(link) for link in links],
            "rank_compute_ms": list(spec.rank_compute_ms),
            "profile_batch": profile_batch,
            "speeds": list(spec.speeds),
            "batch_ms": [dict(c) for c in spec.cluster.worker_batch_curves(spec.workload.model)],
            "overlap_ms_per_mb": list(spec.cluster.worker_overlap_ms_per_mb()),
            "overlap_ms_per_task": list(spec.cluster.worker_overlap_ms_per_task()),
            "overlap_comm_rate": list(spec.cluster.worker_overlap_comm_rate()),
            "update_ms": spec.update_ms,
            "alpha_us": spec.alpha_s * 1e6,
            "allreduce_mbit_s": spec.allreduce_mbit_s,
            "files": {"workload": str(measured_dir / "workload.json"), "cluster": str(measured_dir / "cluster.yaml")},
        }
        plan_path = out_dir / "plan.json"
        if config.plan == "auto":
            say("bench --plan: planning on the measured spec")
            chosen = plan_heterogeneous(
                spec.workload,
                spec.cluster,
                policies=runnable_policies(),
                global_batch=config.global_batch,
                budget_s=config.budget_s,
                sim_options=spec.options(),
                seed=config.seed,
            )
            chosen.save(plan_path)
            plan = chosen.plan
            report["plan"] = {
                **chosen.to_dict(),
                "source": "auto",
                "command": plan_command(
                    spec, "measured/workload.json", "measured/cluster.yaml", config.global_batch, config.budget_s
                ),
            }
        else:
            plan = CommPlan.load(config.plan)
            plan.save(plan_path)
            report["plan"] = {"source": config.plan, "policy": plan.policy, "batch_sizes": plan.batch_sizes}
        global_batch = sum(plan.batch_sizes) if plan.batch_sizes else config.global_batch
        sizes = batch_sizes(spec, plan, global_batch)
        predicted, predicted_trace = predictions(spec, plan, sizes)
        runs = CONFIGS + REFERENCES
        job = {
            **base,
            "out": str(out_dir / "session"),
            "batch_sizes": sizes,
            "plan_path": str(plan_path),
            "repeats": config.repeats,
            "configs": list(runs),
            "reference_batch": profile_batch,
            "reference_at_plan": True,
        }
        steps = config.repeats * (len(runs) * (config.warmup + config.iters) + 1 + CURVE_REPEATS)
        say(f"bench --plan: running {', '.join(runs)} x {config.repeats} repeats")
        files = _launch(bed, "commsched.bench.hetero_worker", job, out_dir / "session", 1, steps, poll)
    traces = merge_traces(out_dir / "session", out_dir, "", n, {"model": config.model, "batch_sizes": sizes})
    if predicted_trace is not None:
        predicted_trace.meta.update(policy=plan.policy, source="simulated", batch_sizes=plan.batch_sizes)
        predicted_trace.save_chrome(out_dir / "trace-plan-predicted.json")
        traces["plan (predicted)"] = "trace-plan-predicted.json"
    report["traces"] = traces
    report["global_batch"] = global_batch
    report["batch_sizes"] = sizes
    references = [f.get("reference", []) for f in files]
    report["measured"]["speed_factors"] = speed_factors(references, spec.rank_compute_ms)
    by_batch = factors_by_batch(references, spec.compute_ms_at)
    saved = [[{str(b): f for b, f in per.items()} for per in row] for row in by_batch]  # JSON: keys are text
    report["measured"]["speed_factors_by_batch"] = saved
    at_run = predictions_at_run_speed(spec, plan, sizes, by_batch)
    report["summary"] = summarise(files, config.warmup, predicted, at_run)
    report["runs"] = files
    report["meta"]["wall_s"] = time.time() - started
    (out_dir / "hetero.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
