"""What each rank of ``commsched bench`` runs: ``python -m commsched.bench.worker JOB.json``.

The rank and the rendezvous come from the environment the testbed sets
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``GLOO_SOCKET_IFNAME``). Three tasks:

``session``
    One gloo process group for everything measured on one link shaping. Per
    repeat: the two references (``compute``: every rank trains its own
    replica with no gradient communication, at the same time as the others
    and in lock-step (a barrier per step), so the CPUs are shared as in real
    runs; ``allreduce``: one all-reduce of a buffer as
    large as all gradients per iteration), then ``torch_ddp`` (first: it is the
    reference of the parameter check), then the other policies and the other
    PyTorch DDP configurations of :mod:`commsched.bench.baselines` (the grid
    of bucket caps × ``find_unused_parameters``; without it only the 1 MiB
    yardstick, with the references) in an order rotated by one per repeat
    (:func:`session_order`). Every run starts after a barrier from the same
    seed and sees the same data.
``compute_alone``
    World size 1: training with no communication at all, nothing else running.
``calibrate``
    What the simulator needs to predict this session: see
    :mod:`commsched.bench.calibrate_task`.

Every rank writes ``rank<r>.json``: per run, the start and the wall time of
every iteration (forward, backward, optimizer step, zero_grad; warm-up
included, the host drops it). Rank 0 also writes the largest parameter difference from
``torch_ddp`` of the same repeat (for ``torch_ddp`` itself: from its first
repeat, the run-to-run noise floor), appends one line per iteration to
``progress.jsonl``, and all ranks save the measured trace of each
commsched policy in the first repeat.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commsched.bench.baselines import BY_NAME, TORCH_DDP, YARDSTICK, ddp_names
from commsched.bench.calibrate_task import calibrate
from commsched.bench.job import Job, Progress
from commsched.bench.threads import all_per_iteration, read_all
from commsched.models import build_model, model_loss, synthetic_batch
from commsched.runtime import parallelize
from commsched.schedule import CommPlan
from commsched.trace import Trace
from commsched.transport import TransportOptions

__all__ = ["YARDSTICK", "save_trace_part", "session_order"]


def session_order(policies: list[str], repeat: int, *, references: bool, ddp_grid: bool) -> list[str]:
    """What one repeat of a session runs after the references: ``torch_ddp`` first, the rest rotated by ``repeat``.

    ``policies`` are the commsched policies asked for; the DDP configurations
    (:func:`commsched.bench.baselines.ddp_names`) always run, ``torch_ddp`` among them.
    """
    ddp = ddp_names(grid=ddp_grid, references=references)
    others = [p for p in policies if p not in ddp] + [n for n in ddp if n != TORCH_DDP]
    k = repeat % len(others) if others else 0
    return [TORCH_DDP, *others[k:], *others[:k]]


def save_trace_part(session_dir: Path, policy: str, rank: int, trace: Trace, **meta: Any) -> None:
    """One rank's trace of one run, ``traces/<policy>.rank<r>.json``, for ``bench.collect.merge_traces``."""
    trace.meta.update(meta)
    (session_dir / "traces").mkdir(exist_ok=True)
    trace.save(session_dir / "traces" / f"{policy}.rank{rank}.json")


def _batches(job: Job, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [synthetic_batch(job.model, job.batch, job.seed, rank, step) for step in range(job.steps)]


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _maybe_fail(job: Job, rank: int, name: str, step: int) -> None:
    f = job.fail
    if f and f.get("rank") == rank and f.get("policy", name) == name and f.get("step", 0) == step:
        print(f"rank {rank}: dying on purpose in {name} at step {step} (job.fail)", file=sys.stderr, flush=True)
        os._exit(17)


class _Clock:
    """Start (from the first step's start) and duration of every step, and of its phases, in seconds.

    Phases of a training step: ``forward`` (model and loss; under forward-mode
    policies it includes waiting for the previous step's updates),
    ``backward`` (includes waiting for the gradients where the policy does,
    as DDP does), ``step`` (``optimizer.step()`` and ``zero_grad()``).
    """

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.starts_s: list[float] = []
        self.times_s: list[float] = []
        self.phases_s: dict[str, list[float]] = {}
        self._t0 = self._lap = 0.0

    def start(self) -> None:
        self._t0 = self._lap = time.perf_counter()
        self.starts_s.append(self._t0 - self.origin)

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases_s.setdefault(phase, []).append(now - self._lap)
        self._lap = now

    def stop(self) -> None:
        self.times_s.append(time.perf_counter() - self._t0)

    def record(self) -> dict[str, Any]:
        return {"starts_s": self.starts_s, "times_s": self.times_s, "phases_s": self.phases_s}


def runtime_knobs(job: Job, policy: str, repeat: int) -> dict[str, Any]:
    """What ``parallelize`` gets besides the policy: the job's knobs for it and, for a commsched policy, the
    timeout, whether to trace this repeat, and the links' MTU where it is not 1500 bytes (a datagram
    transport cuts its datagrams to it)."""
    knobs = dict(job.knobs.get(policy, {}))
    if policy != TORCH_DDP:
        knobs.update(timeout_s=job.comm_timeout_s, trace=repeat == job.trace_repeat)
        if job.mtu_bytes != TransportOptions().mtu_bytes:
            knobs.update(transport_options=TransportOptions(mtu_bytes=job.mtu_bytes))
    return knobs


def _compute(
    job: Job, rank: int, batches: list[Any], progress: Progress, name: str, repeat: int, lockstep: bool = False
) -> dict[str, Any]:
    """Training with no gradient communication: forward, backward, step, zero_grad (+ a barrier in lock-step).

    In lock-step every step ends with a barrier, so the ranks share the CPUs
    as in synchronous training; without it, ranks that share CPUs drift apart
    and the scheduler may favour some for seconds.
    """
    model = build_model(job.model, job.seed)
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)
    clock = _Clock()
    for step, (x, y) in enumerate(batches):
        clock.start()
        loss = model_loss(model(x), y)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        opt.step()
        opt.zero_grad()
        clock.lap("step")
        if lockstep:
            dist.barrier()
        clock.stop()
        progress(name, repeat, step)
    return clock.record()


def _allreduce(job: Job, numel: int, progress: Progress, repeat: int) -> dict[str, Any]:
    """One all-reduce of ``numel`` fp32 values per iteration (all gradients in one buffer)."""
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    clock = _Clock()
    for step in range(job.steps):
        clock.start()
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        clock.stop()
        progress("allreduce", repeat, step)
    return clock.record()


def _policy(
    job: Job, rank: int, policy: str, batches: list[Any], progress: Progress, repeat: int
) -> tuple[dict[str, Any], torch.Tensor, float, Any]:
    model = build_model(job.model, job.seed)
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)
    initial = _flat_params(model)
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ddp = BY_NAME.get(policy)
    if ddp is not None and policy != TORCH_DDP:  # PyTorch DDP as configured: only the summation order changes
        wrapped = DistributedDataParallel(
            model, bucket_cap_mb=ddp.bucket_cap_mb, find_unused_parameters=ddp.find_unused_parameters
        )
        optimizer = opt
    else:
        wrapped, optimizer = parallelize(model, opt, policy=policy, **runtime_knobs(job, policy, repeat))
    clock = _Clock()
    threads_before: dict[str, dict[str, float]] = {}
    for step, (x, y) in enumerate(batches):
        _maybe_fail(job, rank, policy, step)
        if step == job.warmup:
            threads_before = read_all()
        clock.start()
        loss = model_loss(wrapped(x), y)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        optimizer.step()
        optimizer.zero_grad()
        clock.lap("step")
        clock.stop()
        progress(policy, repeat, step)
    # per timed iteration, each thread name's CPU and wait for a core (ms) and sleeps (before any flush or close)
    threads = all_per_iteration(threads_before, job.iters) if threads_before else {}
    flush = getattr(wrapped, "flush", None)
    if flush is not None:
        flush()
    trace = getattr(wrapped, "trace", None)
    plan = getattr(wrapped, "plan", None)  # what ran last (auto's choice after its search and trials)
    chosen: dict[str, Any] = {} if plan is None else {"plan": {"policy": plan.policy, "knobs": plan.knobs.to_dict()}}
    chosen.update(threads)
    replanner = getattr(getattr(wrapped, "engine", None), "replanner", None)
    if replanner is not None and replanner.trials:  # rank 0's: the plans auto measured, in order
        chosen["trials"] = [
            {
                "policy": policy,
                "knobs": CommPlan.from_json(plan_json, "a trial's plan").knobs.to_dict(),
                "mean_ms": None if t is None else t * 1e3,
            }
            for plan_json, policy, t in replanner.trials
        ]
        if replanner.again is not None:  # the fastest trial, measured a second time before it was kept
            index, again_s = replanner.again
            chosen["again"] = {"trial": index, "mean_ms": None if again_s is None else again_s * 1e3}
    params = _flat_params(model)
    close = getattr(wrapped, "close", None)
    if close is not None:
        close()
    return {**clock.record(), **chosen}, params, (params - initial).abs().max().item(), trace


def _replica_spread(params: torch.Tensor) -> float:
    """Largest difference between ranks of the float64 sum of all parameters (0 when replicas agree)."""
    mine = params.double().sum().reshape(1)
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, mine)
    values = [s.item() for s in sums]
    return max(values) - min(values)


def _session(job: Job, rank: int, world: int) -> dict[str, Any]:
    out = Path(job.out)
    progress = Progress(out / "progress.jsonl", rank == 0)
    batches = _batches(job, rank)
    numel = sum(p.numel() for p in build_model(job.model, job.seed).parameters())
    runs: list[dict[str, Any]] = []
    first_ddp: torch.Tensor | None = None  # torch_ddp of repeat 0: its run-to-run difference is the noise floor
    for repeat in range(job.repeats):
        reference: torch.Tensor | None = None
        if job.references:
            dist.barrier()
            compute = _compute(job, rank, batches, progress, "compute", repeat, lockstep=True)
            runs.append({"name": "compute", "repeat": repeat, **compute})
            dist.barrier()
            runs.append({"name": "allreduce", "repeat": repeat, **_allreduce(job, numel, progress, repeat)})
        for policy in session_order(job.policies, repeat, references=job.references, ddp_grid=job.ddp_grid):
            dist.barrier()
            clock, params, moved, trace = _policy(job, rank, policy, batches, progress, repeat)
            run: dict[str, Any] = {"name": policy, "repeat": repeat, **clock, "max_param_moved": moved}
            run["replica_spread"] = _replica_spread(params)
            if policy == TORCH_DDP:
                reference = params
                if first_ddp is None:
                    first_ddp = params
                else:
                    run["max_param_diff"] = (params - first_ddp).abs().max().item()
            elif reference is not None:
                run["max_param_diff"] = (params - reference).abs().max().item()
                run["max_param_abs"] = reference.abs().max().item()
            if trace is not None:
                save_trace_part(out, policy, rank, trace, model=job.model, batch=job.batch, repeat=repeat)
            runs.append(run)
    return {"rank": rank, "world": world, "runs": runs}


def pin_to_core(rank: int) -> int:
    """Run this process, and the threads it starts from now on, on the ``rank``-th core it may use; that core."""
    core = sorted(os.sched_getaffinity(0))[rank]
    os.sched_setaffinity(0, {core})
    return core


def main() -> None:
    job = Job(**json.loads(Path(sys.argv[1]).read_text()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # the runtime's own account (auto's measurements, ranking and choice; re-plans) into the rank's log
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s rank {rank}] %(message)s"))
    logging.getLogger("commsched").addHandler(handler)
    logging.getLogger("commsched").setLevel(logging.INFO)
    if job.pin_cores:  # before any thread starts: they inherit it
        pin_to_core(rank)
    torch.set_num_threads(job.threads)
    out = Path(job.out)
    if job.task == "compute_alone":
        progress = Progress(out / "progress.jsonl", rank == 0)
        runs = [
            {
                "name": "compute_alone",
                "repeat": r,
                **_compute(job, rank, _batches(job, rank), progress, "compute_alone", r),
            }
            for r in range(job.repeats)
        ]
        result: dict[str, Any] = {"rank": rank, "world": world, "runs": runs}
    elif job.task in ("session", "calibrate"):
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=job.comm_timeout_s))
        try:
            result = _session(job, rank, world) if job.task == "session" else calibrate(job, rank, world)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    else:
        raise SystemExit(f"unknown task {job.task!r}")
    result["threads"] = torch.get_num_threads()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
