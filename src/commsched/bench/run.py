"""``commsched bench``: real data-parallel training on the testbed, every policy against default and best DDP.

For each link shaping (a *session*: one launch of the workers, one gloo group),
every policy and every PyTorch DDP configuration of the grid
(:mod:`commsched.bench.baselines`: ``bucket_cap_mb`` ∈ {1, 4, 25} ×
``find_unused_parameters`` ∈ {False, True}) trains ``repeats`` times from the
same seed on the same synthetic data, ``warmup + iters`` iterations each; they
alternate within a repeat so that slow drifts of the machine hit them alike.

The configuration is :mod:`commsched.bench.config`; the summaries and ratios
written into the report, and their definitions, :mod:`commsched.bench.summary`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from commsched.bench.calibrate import load_calibration, predict_session, save_inputs
from commsched.bench.calibrate_task import calibration_sizes
from commsched.bench.collect import _collect, _slug, merge_traces
from commsched.bench.config import BenchConfig
from commsched.bench.overlap import OVERLAP_REPEATS
from commsched.bench.provenance import machine_info, source_info
from commsched.bench.summary import DEFINITIONS, _add_ratios
from commsched.bench.worker import session_order
from commsched.models import build_model, parameter_count
from commsched.testbed.base import Testbed
from commsched.testbed.commands import LinkShape
from commsched.testbed.launch import run_workers
from commsched.testbed.loopback import open_testbed
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.probe import probe_link
from commsched.testbed.system import TestbedError


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
    with open_testbed(config.workers, isolation=config.isolation, mtu_bytes=config.mtu_bytes, log=say) as bed:
        report["meta"]["testbed"] = {
            "isolation": bed.isolation, "description": bed.describe(), "mtu_bytes": config.mtu_bytes
        }  # fmt: skip
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
        # the probe's sizes, the profile, the optimizer step, the overlap rounds and the three task layouts
        overlap_steps = 2 + OVERLAP_REPEATS + 3 * (2 + OVERLAP_REPEATS)
        calibrate_steps = len(calibration_sizes(numel)) + 1 + 2 * steps + overlap_steps if config.validate else 0
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
            "mtu_bytes": config.mtu_bytes,
            "pin_cores": config.pin_cores,
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
                run_job("calibrate", calibration_dir, f"{shape.description} calibrating", calibrate_steps, overlap=True)
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
                # the inputs as validated: bandwidth and compute fitted to the session's references
                references = (session["summary"].get(ref, {}).get("median_ms") for ref in ("allreduce", "compute"))
                save_inputs(calibration.fitted(*references), out_dir / f"calibration-{_slug(shape.label)}")
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
