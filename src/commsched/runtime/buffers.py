"""Gradient buffers: where each task's data lives, filled from ``p.grad``, read back averaged.

Each task owns a flat buffer holding its segments back to back; a
reduce-scatter and the all-gather that depends on it share one buffer (the
all-gather writes back where the reduce-scatter read), padded to a multiple
of the world size with a shard of ``1/world`` of it. A gradient is copied into
the buffers of every task that reads it when it is ready; after the tasks
delivering it have finished, :meth:`GradientBuffers.averaged` reads it back
divided by the world size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commsched.schedule import CommPlan, CommTask
from commsched.transport import TaskBuffer


class GradientBuffers:
    """The buffers of one plan on one rank; ``params[t]`` is the parameter of plan tensor ``t``."""

    __slots__ = ("_buffers", "_offsets", "params", "plan", "world")

    def __init__(self, plan: CommPlan, params: Sequence[torch.Tensor], world: int) -> None:
        self.plan = plan
        self.params = list(params)
        self.world = world
        self._offsets: list[list[int]] = []  # per task: start of each segment in its flat buffer
        buffers: list[TaskBuffer] = []
        for task in plan.tasks:
            offsets, total = [], 0
            for seg in task.segments:
                offsets.append(total)
                total += seg.numel
            self._offsets.append(offsets)
            buffers.append(self._allocate(task, total))
        for task in plan.tasks:  # the second of a pair shares its first's buffer
            if task.kind in ("all_gather", "pull") and task.deps:
                buffers[task.id] = buffers[task.deps[0]]
        self._buffers = buffers

    def _allocate(self, task: CommTask, numel: int) -> TaskBuffer:
        p0 = self.params[task.segments[0].tensor]
        if task.kind in ("reduce_scatter", "all_gather"):
            padded = -(-numel // self.world) * self.world
            flat = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
            return TaskBuffer(flat, torch.zeros(padded // self.world, dtype=p0.dtype, device=p0.device))
        return TaskBuffer(torch.zeros(numel, dtype=p0.dtype, device=p0.device))

    def buffer(self, task: int) -> TaskBuffer:
        return self._buffers[task]

    def fill(self, tensor: int, grad: torch.Tensor | None) -> None:
        """Copy this rank's gradient of ``tensor`` (zeros for ``None``) into every task that reads it."""
        flat_grad = None if grad is None else grad.detach().reshape(-1)
        for task_id in self.plan.tasks_reading_tensor[tensor]:
            task = self.plan.tasks[task_id]
            flat = self._buffers[task_id].flat
            for seg, off in zip(task.segments, self._offsets[task_id], strict=True):
                if seg.tensor != tensor:
                    continue
                dst = flat[off : off + seg.numel]
                if flat_grad is None:
                    dst.zero_()
                else:
                    dst.copy_(flat_grad[seg.start : seg.stop])

    def averaged(self, tensor: int) -> torch.Tensor:
        """The reduced gradient of ``tensor`` divided by the world size (after its final tasks finished)."""
        p = self.params[tensor]
        out = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
        for task_id in self.plan.final_tasks_of_tensor[tensor]:
            task = self.plan.tasks[task_id]
            flat = self._buffers[task_id].flat
            for seg, off in zip(task.segments, self._offsets[task_id], strict=True):
                if seg.tensor == tensor:
                    out[seg.start : seg.stop] = flat[off : off + seg.numel]
        return out.div_(self.world)

    def write_averaged_grads(self, has_grad: Sequence[bool]) -> None:
        """``p.grad`` = the averaged gradient for every tensor with ``has_grad[t]``: one pass, no temporaries."""
        for task in self.plan.tasks:
            if task.kind not in ("all_reduce", "all_gather", "pull"):
                continue
            flat = self._buffers[task.id].flat
            for seg, off in zip(task.segments, self._offsets[task.id], strict=True):
                p = self.params[seg.tensor]
                if not has_grad[seg.tensor] or p.grad is None:
                    continue
                src = flat[off : off + seg.numel]
                if p.grad.is_contiguous():
                    torch.div(src, self.world, out=p.grad.view(-1)[seg.start : seg.stop])
                else:  # e.g. channels_last: go through a contiguous copy
                    flat_grad = p.grad.reshape(-1).clone()
                    torch.div(src, self.world, out=flat_grad[seg.start : seg.stop])
                    p.grad.copy_(flat_grad.view_as(p.grad))

    def shard_square_sum(self) -> torch.Tensor | None:
        """Σ (shard / world)² over this rank's reduce-scatter shards (float64), or None without shards."""
        shards = [b.shard for t, b in zip(self.plan.tasks, self._buffers, strict=True) if t.kind == "reduce_scatter"]
        if not shards:
            return None
        sq = torch.zeros((), dtype=torch.float64)
        for shard in shards:
            assert shard is not None
            sq += shard.double().div(self.world).pow(2).sum()
        return sq
