"""PyTorch DistributedDataParallel's bucketed all-reduce, overlapped with backward.

Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020. Gradients are fused into buckets in gradient-ready
order (DDP's rebuilt buckets, steady state): the first bucket is capped at
``first_bucket_mb`` (1 MiB), the others at ``bucket_cap_mb`` (25 MiB); a bucket
closes once it reaches its cap. Buckets are all-reduced in index order as soon
as they are full, overlapping with the rest of backward; the optimizer runs at
``step()`` after every all-reduce finished.

With ``rebuilt=False`` the buckets are DDP's initial ones, which it keeps
when it cannot rebuild them (``find_unused_parameters=True``; checked with
``DistributedDataParallel._get_ddp_logging_data()`` on torch 2.13): tensors
taken in registration (here: forward) order, the first bucket capped at
``first_bucket_mb`` (so it holds the first layers), then reduced from the
last bucket to the first; a bucket still waits for all its gradients.

Guarantee: lossless; identical to plain synchronous SGD.
Knobs: ``bucket_cap_mb`` (25), ``first_bucket_mb`` (1; ``None`` = same as the
cap), ``rebuilt`` (True: buckets in gradient-ready order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import BucketsInOrder, NetworkEstimate
from commsched.schedule.fusion import fuse_by_threshold, layer_priority, make_task, ready_order, whole
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class DDPKnobs(Knobs):
    policy: ClassVar[str] = "ddp"
    bucket_cap_mb: float = knob(25.0, ge=0, doc="bucket cap, MiB (0: one bucket per tensor)")
    first_bucket_mb: float | None = knob(1.0, ge=0, doc="cap of the first bucket, MiB (none: the bucket cap)")
    rebuilt: bool = knob(True, doc="buckets in gradient-ready order (false: DDP's initial buckets)")


class DDPScheduler(BucketsInOrder):
    name: ClassVar[str] = "ddp"
    knob_type: ClassVar[type[Knobs]] = DDPKnobs

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, DDPKnobs)
        first = None if knobs.first_bucket_mb is None else mb_to_bytes(knobs.first_bucket_mb)
        order = ready_order(workload) if knobs.rebuilt else range(len(workload.tensors))
        groups = fuse_by_threshold(workload, order, mb_to_bytes(knobs.bucket_cap_mb), first)
        if not knobs.rebuilt:  # the bucket of the last layers is reduced first
            groups.reverse()
        tasks = []
        for i, group in enumerate(groups):
            segs = whole(workload, group)
            tasks.append(make_task(workload, i, "all_reduce", segs, f"bucket{i}", layer_priority(workload, segs)))
        return CommPlan(cls.name, workload, network, tuple(tasks), "step", knobs)
