"""The ``calibrate`` task of ``commsched bench``'s workers: what the simulator needs to predict a session.

Run by every rank of :mod:`commsched.bench.worker` (``task: calibrate``) in
one gloo process group, on the same shaped links and with the ranks sharing
the same CPUs as in the session:

1. the α-β fit of the shaped links (:func:`commsched.profile.network.probe_network`:
   gloo's ring all-reduce and the runtime's ring reduce-scatter/all-gather over
   a sweep of sizes, :func:`calibration_sizes`; and a push with its pull through
   the ``"ps"`` transport, whose CPU work prices that transport's tasks);
2. every rank profiles its own replica layer by layer
   (:func:`commsched.profile.profile_model`) at the same time, in lock-step (a
   barrier per iteration), so the profile has the CPU sharing of a real run;
3. with ``Job.curve_global_batch``, forward + backward at local batches of its
   own around its speed-proportional share of that global batch
   (:func:`commsched.bench.batch_curve.batches_around_shares`, from every rank's
   profiled time), in lock-step, for the cluster spec's ``model_batch_ms``;
4. with ``Job.overlap``, backward alone against backward beside an all-reduce
   of :data:`~commsched.bench.overlap.OVERLAP_VOLUME` times all gradients'
   bytes (:mod:`commsched.bench.overlap`), for the cluster spec's
   ``overlap_ms_per_mb`` and ``overlap_comm_rate``; then, at the rank's
   speed-proportional share of ``curve_global_batch``, the backward alone
   against the backward beside the runtime's own tasks in three bucket layouts
   (:mod:`commsched.bench.task_overlap`), for its ``overlap_ms_per_task`` and
   (the layouts together) ``overlap_ms_per_mb``;
5. PyTorch DDP's copies of the gradients into its buckets and back
   (:mod:`commsched.bench.copies`), which the simulator charges to the
   PyTorch DDP rows;
6. ``optimizer.step()`` + ``zero_grad()``, timed the same way (``update_ms``).

Every rank returns its own measurements (rank 0's also hold the probe), which
the worker writes as ``rank<r>.json``.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from commsched.bench.batch_curve import batches_around_shares, curve_points, proportional_share, time_batch_curve
from commsched.bench.copies import time_bucket_copies
from commsched.bench.job import Job, Progress
from commsched.bench.overlap import OVERLAP_REPEATS, OVERLAP_VOLUME, time_overlap
from commsched.bench.task_overlap import TaskOverlap, layouts, time_task_overlap
from commsched.models import build_model, model_loss, synthetic_batch

__all__ = ["calibrate", "calibration_sizes"]


def calibration_sizes(numel: int) -> list[int]:
    """Message sizes of the calibration's network probe: 16 KiB ×4 up to all of a model's fp32 gradients."""
    return sorted({min(4**k * 1024, numel * 4) for k in range(2, 9)})


def calibrate(job: Job, rank: int, world: int) -> dict[str, Any]:
    """The steps of the module docstring on this rank (every rank of the process group calls it together)."""
    from commsched.profile import profile_model
    from commsched.profile.network import GLOO_OP, OPS, PS_OP, probe_network

    progress = Progress(Path(job.out) / "progress.jsonl", rank == 0)
    model = build_model(job.model, job.seed)
    numel = sum(p.numel() for p in model.parameters())
    probe = probe_network(
        sizes_bytes=calibration_sizes(numel),
        repeats=job.iters,
        warmup=1,
        ops=(*OPS, PS_OP, GLOO_OP),  # the "ps" transport's CPU work is its own; PyTorch DDP's is gloo's
        progress=lambda _: progress("probe", 0, 0),
    )
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)

    def lockstep(done: int, total: int) -> None:
        dist.barrier()
        progress("profile", 0, done)

    workload = profile_model(
        model,
        lambda: synthetic_batch(job.model, job.batch, job.seed, rank, 0),
        model_loss,
        batch_size=job.batch,
        model_name=job.model,
        warmup=job.warmup,
        repeats=job.iters,
        command=f"commsched bench --validate (rank {rank} of {world}, profiled in lock-step)",
        progress=lockstep,
    )
    batches: list[int] = []
    share = job.batch
    if job.curve_global_batch > 0:  # around this rank's share, from every rank's time at the profile's batch
        mine = torch.tensor([workload.extra["iteration_ms"]], dtype=torch.float64)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, mine)
        times = [t.item() for t in gathered]
        batches = batches_around_shares(job.batch, times, job.curve_global_batch)[rank]
        share = proportional_share(times, job.curve_global_batch, rank)
    curve = time_batch_curve(job.model, batches, job.seed, rank, model, lambda i: progress("batch curve", 0, i))
    x, y = synthetic_batch(job.model, job.batch, job.seed, rank, 0)
    overlap = None
    tasks: dict[str, TaskOverlap | None] = {}
    if job.overlap:
        overlap = time_overlap(model, (x, y), OVERLAP_VOLUME * numel * 4, lambda i: progress("overlap", 0, i))
        at_share = synthetic_batch(job.model, share, job.seed, rank, 0)
        for key, (cap, first) in layouts(numel * 4 / 2**20).items():
            tasks[key] = time_task_overlap(
                job.model,
                job.seed,
                at_share,
                OVERLAP_REPEATS,
                job.comm_timeout_s,
                functools.partial(progress, key.replace("_", " "), 0),
                bucket_cap_mb=cap,
                first_bucket_mb=first,
            )
    dist.barrier()
    copies = time_bucket_copies(model, (x, y), world, lambda i: progress("bucket copies", 0, i))
    step_s = []
    for i in range(job.warmup + job.iters):
        model_loss(model(x), y).backward()
        dist.barrier()
        start = time.perf_counter()
        opt.step()
        opt.zero_grad()
        if i >= job.warmup:
            step_s.append(time.perf_counter() - start)
        progress("optimizer step", 0, i)
    return {
        "rank": rank,
        "world": world,
        "samples": [asdict(s) for s in probe.samples],
        "workload": json.loads(workload.to_json()),
        "update_ms": statistics.median(step_s) * 1e3,
        "bucket_copies": asdict(copies),
        "batch_ms": {str(b): ms for b, ms in curve_points(curve, job.batch).items()},
        "batch_times_ms": {str(b): t for b, t in curve.items()},
        **({"overlap": asdict(overlap)} if overlap is not None else {}),
        **{key: asdict(t) for key, t in tasks.items() if t is not None},
        **({"task_overlap_batch": share} if tasks else {}),
    }
