"""Gradient buffers: where each task's data lives, filled from ``p.grad``, read back averaged.

Each task owns a flat buffer holding its segments back to back; a
reduce-scatter and the all-gather that depends on it share one buffer (the
all-gather writes back where the reduce-scatter read), padded to a multiple
of the world size with a shard of ``1/world`` of it. A gradient enters the
buffers of every task that reads it when it is ready, **multiplied by
``1/world`` on the way in** (one pass that copies and scales, as PyTorch DDP
divides while copying into its buckets), so what every summing reduction
leaves in the buffer is already the average: it is read back as it is, a
view where the tensor lies in one piece.

**Gradients as bucket views** (``update="step"`` plans, as DDP's
``gradient_as_bucket_view``): a tensor that lies whole and contiguous in one
all-reduce buffer has its gradient copied in, scaled, when it is ready, and
``p.grad`` becomes its view of that buffer (:meth:`GradientBuffers.attach_view`),
so the reduced average needs no copy out. ``p.grad`` stays ``None`` until the
gradient is ready: after ``zero_grad(set_to_none=True)``, PyTorch's default,
autograd hands over a fresh gradient (nothing to zero before the forward, no
accumulation into the buffer), and a parameter that receives no gradient
keeps ``None``, so the optimizer skips it, as under DDP. A gradient that
already is the view (zeroed in place, or accumulated over several backward
passes) is scaled in place. Plans that apply updates later
(``update="forward"``) keep ``p.grad`` apart from the buffers: the buffers are
still in flight when the user zeroes the gradients.

Measured (resnet5m, 2 gloo ranks with a core each): zeroing every view before
the forward (0.6 ms), autograd accumulating into them instead of handing over
its own tensor (1.6 ms) and dividing the reduced buffers (0.8 ms) cost more
than the one scaled copy (1.7 ms) that replaces them.

**Per-rank batches** (``weight`` = ``b_r / B``, :mod:`~commsched.runtime.batches`):
the local gradient is multiplied by ``weight`` instead of ``1/world``, and the
reduced buffer is a weighted sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commsched.schedule import CommPlan, CommTask
from commsched.transport import TaskBuffer


class GradientBuffers:
    """The buffers of one plan on one rank; ``params[t]`` is the parameter of plan tensor ``t``."""

    __slots__ = (
        "_buffers",
        "_in_place",
        "_offsets",
        "_targets",
        "_views",
        "params",
        "plan",
        "scale",
        "weight",
        "world",
    )

    def __init__(self, plan: CommPlan, params: Sequence[torch.Tensor], world: int, weight: float | None = None) -> None:
        self.plan = plan
        self.params = list(params)
        self.world = world
        #: factor of this rank's gradient before a summing reduction (None: even batches, ``1/world``)
        self.weight = weight
        #: what a gradient is multiplied by as it enters a buffer: the reductions' sums are then the result
        self.scale = 1.0 / world if weight is None else weight
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
        self._views = [self._whole_view(t) for t in range(len(self.params))]
        #: per tensor: (its slice of the buffer, the tensor's elements it takes) for every task
        #: reading it, sliced once here (a slice per gradient and iteration costs more than the copy check)
        self._targets = [self._slices_reading(t) for t in range(len(self.params))]
        #: per tensor: only its bucket view reads it (a gradient that is the view is already in place: filling
        #: it is scaling it there)
        self._in_place = [
            v is not None and len(d) == 1 and d[0][0].data_ptr() == v.data_ptr()
            for v, d in zip(self._views, self._targets, strict=True)
        ]

    def _allocate(self, task: CommTask, numel: int) -> TaskBuffer:
        p0 = self.params[task.segments[0].tensor]
        if task.kind in ("reduce_scatter", "all_gather"):
            padded = -(-numel // self.world) * self.world
            flat = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
            return TaskBuffer(flat, torch.zeros(padded // self.world, dtype=p0.dtype, device=p0.device))
        return TaskBuffer(torch.zeros(numel, dtype=p0.dtype, device=p0.device))

    def _whole_view(self, tensor: int) -> torch.Tensor | None:
        """``tensor``'s view of the one buffer that delivers it whole (None when it is cut in pieces)."""
        finals = self.plan.final_tasks_of_tensor[tensor]
        p = self.params[tensor]
        if len(finals) != 1:
            return None
        task = self.plan.tasks[finals[0]]
        for seg, off in zip(task.segments, self._offsets[task.id], strict=True):
            if seg.tensor == tensor:
                if seg.numel != p.numel():
                    return None
                return self._buffers[task.id].flat[off : off + seg.numel].view(p.shape)
        return None

    def _slices_reading(self, tensor: int) -> list[tuple[torch.Tensor, int, int]]:
        out = []
        for task_id in self.plan.tasks_reading_tensor[tensor]:
            task, flat = self.plan.tasks[task_id], self._buffers[task_id].flat
            for seg, off in zip(task.segments, self._offsets[task_id], strict=True):
                if seg.tensor == tensor:
                    out.append((flat[off : off + seg.numel], seg.start, seg.stop))
        return out

    def buffer(self, task: int) -> TaskBuffer:
        return self._buffers[task]

    # ---- in ----

    def fill(self, tensor: int, grad: torch.Tensor | None) -> None:
        """This rank's gradient of ``tensor`` times :attr:`scale` (zeros for ``None``) into every task that reads
        it: copied and scaled in one pass, or scaled in place where ``grad`` is the bucket view."""
        targets = self._targets[tensor]
        scale = self.scale
        if grad is not None and self._in_place[tensor] and grad.data_ptr() == targets[0][0].data_ptr():
            if scale != 1.0:
                targets[0][0].mul_(scale)
            return
        flat_grad = None if grad is None else grad.detach().reshape(-1)
        for dst, start, stop in targets:
            if flat_grad is None:
                dst.zero_()
                continue
            src = flat_grad[start:stop]
            if src.data_ptr() == dst.data_ptr():  # p.grad is the bucket view
                if scale != 1.0:
                    dst.mul_(scale)
            elif scale == 1.0:
                dst.copy_(src)
            else:
                torch.mul(src, scale, out=dst)

    def attach_view(self, tensor: int) -> None:
        """``p.grad`` = ``tensor``'s bucket view, where it has one (after :meth:`fill`: the view holds the
        gradient, and the reduction's average lands in ``p.grad`` with no copy out)."""
        view = self._views[tensor]
        if view is not None and not self.is_view(tensor):
            self.params[tensor].grad = view

    def is_view(self, tensor: int) -> bool:
        """Whether ``p.grad`` of ``tensor`` is its bucket view."""
        view, grad = self._views[tensor], self.params[tensor].grad
        return view is not None and grad is not None and grad.data_ptr() == view.data_ptr()

    # ---- out ----

    def averaged(self, tensor: int) -> torch.Tensor:
        """The reduced gradient of ``tensor``: the average, or the weighted sum with a ``weight`` (after its
        final tasks finished; the gradients were scaled on the way in).

        A view of the buffer where the tensor lies whole in one (valid until the buffer is filled again),
        else a new tensor gathered from its pieces.
        """
        view = self._views[tensor]
        if view is not None:
            return view
        p = self.params[tensor]
        out = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
        for task_id in self.plan.final_tasks_of_tensor[tensor]:
            task = self.plan.tasks[task_id]
            flat = self._buffers[task_id].flat
            for seg, off in zip(task.segments, self._offsets[task_id], strict=True):
                if seg.tensor == tensor:
                    out[seg.start : seg.stop] = flat[off : off + seg.numel]
        return out.view(p.shape)

    def write_averaged_grads(self, has_grad: Sequence[bool]) -> None:
        """``update="step"``: ``p.grad`` = the averaged gradient of every tensor with ``has_grad[t]``.

        Bucket views stay as they are (the reduction left the average in them; every tensor with a view has it
        as ``p.grad`` by now, whatever the parameter's memory format: :meth:`attach_view`); a tensor cut
        across tasks gets the average gathered from its pieces.
        """
        for t, p in enumerate(self.params):
            if not has_grad[t] or p.grad is None or self.is_view(t):
                continue
            avg = self.averaged(t)
            if self._views[t] is not None and p.grad.is_contiguous() and p.grad.dtype == avg.dtype:
                p.grad = avg
            else:
                p.grad.copy_(avg)

    def shard_square_sum(self) -> torch.Tensor | None:
        """Σ shard² over this rank's reduce-scatter shards (float64; averaged, or weighted sums, already), or None
        without shards."""
        shards = [b.shard for t, b in zip(self.plan.tasks, self._buffers, strict=True) if t.kind == "reduce_scatter"]
        if not shards:
            return None
        sq = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for shard in shards:
            assert shard is not None
            sq += shard.double().pow(2).sum().to(sq.device)
        return sq
