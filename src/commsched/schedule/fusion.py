"""Helpers shared by policies: ready order, size-threshold fusion, partitioning."""

from __future__ import annotations

from collections.abc import Sequence

from commsched.schedule.base import COLLECTIVE, CommTask, Segment, TaskKind
from commsched.workload import DTYPE_BYTES, Workload


def ready_order(workload: Workload) -> list[int]:
    """Tensor indices in the order their gradients become ready.

    Sorted by ``grad_ready_ms``; ties are broken by reverse forward order, which
    is the order autograd produces gradients within a layer stage.
    """
    ready = workload.grad_ready_ms
    return sorted(range(len(ready)), key=lambda t: (ready[t], -t))


def fuse_by_threshold(
    workload: Workload, order: Sequence[int], threshold_bytes: int, first_bytes: int | None = None
) -> list[list[int]]:
    """Group tensors (taken in ``order``) into buckets of about ``threshold_bytes``.

    A bucket is closed as soon as it reaches or exceeds its cap (PyTorch DDP's
    rule, so a large tensor can overshoot it); ``first_bytes`` caps the first
    bucket only. ``threshold_bytes <= 0`` puts every tensor in its own bucket.
    """
    tensors = workload.tensors
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for t in order:
        current.append(t)
        current_bytes += tensors[t].bytes
        cap = first_bytes if (first_bytes is not None and not groups) else threshold_bytes
        if current_bytes >= cap:
            groups.append(current)
            current, current_bytes = [], 0
    if current:
        groups.append(current)
    return groups


def fuse_below_threshold(items: Sequence[int], sizes: Sequence[int], threshold_bytes: int) -> list[list[int]]:
    """DeAR's rule: add an item (``sizes[item]`` bytes) while the running total stays below the threshold.

    An item larger than the threshold forms its own group; items are never split.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for t in items:
        nbytes = sizes[t]
        if current and current_bytes + nbytes >= threshold_bytes:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(t)
        current_bytes += nbytes
    if current:
        groups.append(current)
    return groups


def whole(workload: Workload, tensors: Sequence[int]) -> tuple[Segment, ...]:
    """Segments covering the given tensors completely."""
    return tuple(Segment(t, 0, workload.tensors[t].numel) for t in tensors)


def segments_bytes(workload: Workload, segments: Sequence[Segment]) -> int:
    return sum(s.numel * DTYPE_BYTES[workload.tensors[s.tensor].dtype] for s in segments)


def partition(workload: Workload, tensor: int, partition_bytes: int) -> list[Segment]:
    """Split one tensor into consecutive pieces of at most ``partition_bytes``."""
    t = workload.tensors[tensor]
    per = max(1, partition_bytes // DTYPE_BYTES[t.dtype])
    return [Segment(tensor, start, min(start + per, t.numel)) for start in range(0, t.numel, per)]


def make_task(
    workload: Workload,
    task_id: int,
    kind: TaskKind,
    segments: Sequence[Segment],
    name: str,
    priority: int = 0,
    deps: tuple[int, ...] = (),
    transport: str = COLLECTIVE,
) -> CommTask:
    return CommTask(
        id=task_id,
        kind=kind,
        segments=tuple(segments),
        bytes=segments_bytes(workload, segments),
        name=name,
        priority=priority,
        deps=deps,
        transport=transport,
    )


def layer_priority(workload: Workload, segments: Sequence[Segment]) -> int:
    """Priority of a piece: the smallest layer index it touches (0 = nearest the input)."""
    return min(workload.tensor_layer[s.tensor] for s in segments)
