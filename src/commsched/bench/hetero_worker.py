"""What each rank of ``commsched bench --plan`` runs: ``python -m commsched.bench.hetero_worker JOB.json``.

One gloo process group for the whole session. Per repeat, every
configuration of the job trains ``warmup + iters`` iterations from the same
seed, in an order rotated by one per repeat, each after a barrier:

* ``even_ddp``: ``DistributedDataParallel(model)`` at PyTorch's defaults,
  every rank the same share of the global batch (what a user runs);
* ``proportional_dp``: ``commsched.parallelize(policy="ddp", batch_sizes=...)``,
  shares ∝ measured speed, gradients weighted by ``b_i / B`` and summed by the
  runtime's ring all-reduce (gloo);
* ``plan``: ``commsched.parallelize(plan=PATH)``, the plan's policy, knobs and
  per-rank batches;
* ``plan_compute`` (a reference, not a configuration to choose): the plan's
  per-rank batches with no gradient communication, the ranks in lock-step (a
  barrier after every step): what the plan's iteration would take if
  communication cost nothing, so that a prediction's error splits into
  compute and communication.

Every configuration sees the same data: step ``s``'s global batch of ``B``
samples is drawn once (:func:`commsched.models.synthetic_batch`, rank 0's
stream) and rank ``r`` takes its ``b_r`` consecutive samples after ranks
``0 .. r-1`` (as :class:`commsched.data.SplitBatchSampler` hands them out).
With the runtime's ``b_i / B`` weights every configuration then computes the
gradient of the same global batch, so their parameters agree up to float
summation order on models without BatchNorm (BatchNorm's statistics are per
rank, so uneven splits differ by design). Rank 0 records the largest
parameter difference from ``even_ddp`` of the same repeat.

With ``reference_batch``, every repeat starts with every rank timing its
forward + backward at that batch in lock-step, as the calibration did
(:func:`commsched.bench.drift.time_reference`), and with
``reference_at_plan`` at its batch in the plan too, the two taking turns:
the host's compute speed in that repeat against the calibration's, for the
predictions at the runs' speed (:mod:`commsched.bench.drift`).

Every rank writes ``rank<r>.json``: per run the start and the wall time of
every iteration (warm-up included; the host drops it), per repeat the
reference's rounds (``reference``), and rank 0 appends
one line per iteration to ``progress.jsonl``. The runtime's configurations
record their trace in the first repeat (``traces/<config>.rank<r>.json``:
every task's launch and completion, as ``commsched bench`` saves them).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commsched.bench.drift import time_reference
from commsched.bench.job import Progress
from commsched.bench.worker import _Clock, _flat_params, save_trace_part
from commsched.models import build_model, model_loss, synthetic_batch
from commsched.runtime import parallelize

#: The configurations, in the order of a first repeat.
CONFIGS = ("even_ddp", "proportional_dp", "plan")
#: Runs measured beside them for reference: the plan's compute with no communication.
REFERENCES = ("plan_compute",)
#: The configurations run by the runtime, whose first repeat records a trace.
TRACED = ("proportional_dp", "plan")


@dataclass(frozen=True)
class HeteroJob:
    out: str
    model: str
    batch_sizes: dict[str, list[int]]  # per configuration, per rank
    plan_path: str
    iters: int
    warmup: int
    repeats: int
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    seed: int = 0
    lr: float = 0.01
    momentum: float = 0.9
    threads: int = 1
    comm_timeout_s: float = 60.0
    reference_batch: int = 0  # > 0: time forward + backward at this batch before every repeat
    reference_at_plan: bool = False  # and, in the same rounds, at the plan's batch of each rank

    @property
    def steps(self) -> int:
        return self.warmup + self.iters


def order(configs: list[str], repeat: int) -> list[str]:
    """The configurations of one repeat, rotated by ``repeat`` so that slow drifts hit them alike."""
    k = repeat % len(configs)
    return configs[k:] + configs[:k]


def local_batches(job: HeteroJob, config: str, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s share of every step's global batch under ``config`` (the module docstring)."""
    sizes = job.batch_sizes[config]
    start = sum(sizes[:rank])
    out = []
    for step in range(job.steps):
        x, y = synthetic_batch(job.model, sum(sizes), job.seed, 0, step)
        out.append((x[start : start + sizes[rank]], y[start : start + sizes[rank]]))
    return out


def _wrap(job: HeteroJob, config: str, model: torch.nn.Module, opt: torch.optim.Optimizer, trace: bool) -> Any:
    if config == "even_ddp":
        return DistributedDataParallel(model), opt
    if config == "proportional_dp":
        sizes = job.batch_sizes[config]
        return parallelize(model, opt, policy="ddp", batch_sizes=sizes, timeout_s=job.comm_timeout_s, trace=trace)
    if config == "plan":
        return parallelize(model, opt, plan=job.plan_path, timeout_s=job.comm_timeout_s, trace=trace)
    if config == "plan_compute":
        return model, opt
    raise ValueError(f"config: unknown {config!r}; known: {', '.join(CONFIGS + REFERENCES)}")


def _run(job: HeteroJob, rank: int, config: str, repeat: int, progress: Progress) -> tuple[dict[str, Any], Any]:
    batches = local_batches(job, config, rank)
    model = build_model(job.model, job.seed)
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)
    traced = config in TRACED and repeat == 0
    wrapped, optimizer = _wrap(job, config, model, opt, traced)
    lockstep = config in REFERENCES
    clock = _Clock()
    for step, (x, y) in enumerate(batches):
        clock.start()
        loss = model_loss(wrapped(x), y)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        optimizer.step()
        optimizer.zero_grad()
        clock.lap("step")
        if lockstep:
            dist.barrier()
        clock.stop()
        progress(config, repeat, step)
    flush = getattr(wrapped, "flush", None)
    if flush is not None:
        flush()
    trace = getattr(wrapped, "trace", None) if traced else None
    if trace is not None:
        batch = job.batch_sizes[config][rank]
        save_trace_part(Path(job.out), config, rank, trace, model=job.model, batch=batch, repeat=repeat)
    close = getattr(wrapped, "close", None)
    if close is not None:
        close()
    return clock.record(), _flat_params(model)


def session(job: HeteroJob, rank: int, world: int) -> dict[str, Any]:
    progress = Progress(Path(job.out) / "progress.jsonl", rank == 0)
    runs: list[dict[str, Any]] = []
    references: list[dict[str, Any]] = []
    for repeat in range(job.repeats):
        if job.reference_batch > 0:
            model = build_model(job.model, job.seed)
            tick = functools.partial(progress, "reference", repeat)
            batches = [job.reference_batch]
            if job.reference_at_plan:  # every rank times two batches (lock-step), the same one twice if so
                batches.append(job.batch_sizes["plan"][rank])
            rounds = time_reference(job.model, batches, job.seed, rank, model, tick)
            record: dict[str, Any] = {"repeat": repeat, "batch": job.reference_batch, "ms": rounds[0]}
            if len(batches) > 1 and batches[1] != job.reference_batch:
                record["at"] = {str(batches[1]): rounds[1]}
            references.append(record)
        params: dict[str, torch.Tensor] = {}
        for config in order(job.configs, repeat):
            dist.barrier()
            record, params[config] = _run(job, rank, config, repeat, progress)
            runs.append({"name": config, "repeat": repeat, "batch": job.batch_sizes[config][rank], **record})
        if "even_ddp" in params:
            for run in runs[-len(job.configs) :]:
                run["max_param_diff"] = (params[run["name"]] - params["even_ddp"]).abs().max().item()
    return {"rank": rank, "world": world, "runs": runs, "reference": references}


def main() -> None:
    job = HeteroJob(**json.loads(Path(sys.argv[1]).read_text()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(job.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=job.comm_timeout_s))
    try:
        result = session(job, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    result["threads"] = torch.get_num_threads()
    (Path(job.out) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
