"""Training under a plan with pipeline stages: ``parallelize(model, optimizer, plan=...)`` on an ``nn.Sequential``.

Each rank keeps only the children of the stages it runs
(:mod:`commsched.runtime.stages`); the others are moved to the ``meta``
device, so their parameters, gradients and optimizer state take no memory.
One training step, :meth:`PipelineModule.train_step`, is:

1. every pipeline runs its ``batch_size`` samples of the global batch ``B`` in
   ``micro_batches`` equal micro-batches: through
   :mod:`torch.distributed.pipelining` (``PipelineStage`` with ``Schedule1F1B``
   or ``ScheduleGPipe``, activations and their gradients sent between the
   pipeline's ranks over its own process group) when it has several ranks, as
   plain forward and backward passes when it has one. The loss of a
   micro-batch of ``m`` samples is ``loss_fn(output, target) · m / B``, so with
   a mean-reduced ``loss_fn`` each pipeline's gradient is its share of the
   global batch's;
2. each task of the plan (one bucket of one stage's gradients) is summed over
   the ranks that hold that stage, one per pipeline, on a process group of
   theirs, in plan order on every rank (a global order, so it cannot deadlock).

The result is the gradient of one process on the global batch, left in
``p.grad`` of the rank's parameters; the user's ``optimizer.step()`` updates
them (parameters on ``meta`` have no gradient and are skipped). Within a stage
the ranks start from rank ``holders[0]``'s parameters and buffers.

Not supported with stages: ``max_grad_norm``, a ``GradScaler``, ``no_sync()``,
``trace``, and calling the model directly (``model(x)``: a rank holds part of
it); every parameter must receive a gradient in every step (unused ones are
reduced as zeros).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from commsched.data import SplitBatchSampler
from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.runtime import startup
from commsched.runtime.stages import BoundStages, bind_stages
from commsched.schedule import CommPlan
from commsched.transport.groups import release_groups

LossFn = Callable[[Any, Any], torch.Tensor]


@contextmanager
def _peer_failures(what: str) -> Iterator[None]:
    """A peer that crashed or hung becomes a RuntimeCommError naming ``what``: the backend's errors
    (``DistBackendError``; gloo raises a plain RuntimeError whose message names its transport, for a closed
    connection as for a timeout). Errors of the model or the loss pass through as they are."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, dist.DistBackendError) or "gloo/transport" in str(exc):
            raise RuntimeCommError(f"{what} failed, a peer may have crashed or hung: {exc}") from exc
        raise


def staged_refusals(max_grad_norm: float | None, grad_scaler: object, batch_sizes: object, trace: bool) -> str:
    """Why ``parallelize`` refuses these arguments with a plan that has stages ("" when it does not)."""
    given = [
        name
        for name, value in (
            ("max_grad_norm", max_grad_norm),
            ("grad_scaler", grad_scaler),
            ("batch_sizes", batch_sizes),
            ("trace", trace or None),
        )
        if value is not None
    ]
    if not given:
        return ""
    return (
        f"parallelize: {', '.join(given)} not supported with a plan that has pipeline stages "
        "(the pipelines' batches come from the plan)"
    )


class PipelineModule(nn.Module):
    """This rank's part of a model trained under a plan with stages (module docstring)."""

    def __init__(
        self,
        module: nn.Sequential,
        plan: CommPlan,
        process_group: dist.ProcessGroup | None,
        timeout_s: float,
    ) -> None:
        super().__init__()
        self.module = module
        self.plan = plan
        self.rank = dist.get_rank(process_group)
        world = dist.get_world_size(process_group)
        bound = bind_stages(module, plan, world)
        layout = bound.layout
        self._bound = bound
        self._timeout = timedelta(seconds=timeout_s)
        ranks = list(range(world)) if process_group is None else dist.get_process_group_ranks(process_group)
        self._global = ranks
        control = startup.control_group(process_group, timeout_s)
        mine = startup.fingerprint(module, plan.policy, plan.knobs.to_dict(), plan.to_json(indent=None), world, 0, None)
        startup.agree(mine, control)
        p_index, position = layout.placement[self.rank]
        self.pipeline_index = p_index
        pipe = layout.pipelines[p_index]
        self._pipe = pipe
        self._position = position
        self.stages = layout.stages_of_rank(self.rank)
        # groups: every rank creates every group, in the same order
        pipe_groups = [self._new_group(p.ranks) if p.depth > 1 else None for p in layout.pipelines]
        self._pipe_group = pipe_groups[p_index]
        holder_groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for s in range(layout.num_stages):
            holders = layout.holders(s)
            if len(holders) > 1 and holders not in holder_groups:
                holder_groups[holders] = self._new_group(holders)
        #: what :meth:`close` releases (empty once closed)
        self._groups: list[dist.ProcessGroup | None] = [control, *pipe_groups, *holder_groups.values()]
        children = list(module)
        first, last = bound.children[self.stages.start], bound.children[self.stages.stop - 1]
        self._children = range(first.start, last.stop)
        # identical replicas within each stage, then release what this rank does not run
        for s in self.stages:
            holders = layout.holders(s)
            if len(holders) > 1:
                tensors = [t for c in bound.children[s] for t in (*children[c].parameters(), *children[c].buffers())]
                startup.broadcast_tensors(
                    tensors, self._global[holders[0]], holder_groups[holders], f"broadcasting stage {s}"
                )
        for c, child in enumerate(children):
            if c not in self._children:
                child.to("meta")
        self.local = nn.Sequential(*children[first.start : last.stop])
        # the plan's tasks that this rank takes part in: (group, parameters, flat buffer)
        self._syncs: list[tuple[dist.ProcessGroup, list[nn.Parameter], torch.Tensor]] = []
        for task, s in zip(plan.tasks, bound.task_stage, strict=True):
            holders = layout.holders(s)
            if s in self.stages and len(holders) > 1:
                params = list(dict.fromkeys(bound.params[t] for t in task.tensors))
                flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
                self._syncs.append((holder_groups[holders], params, flat))
        self._loss_fn: LossFn | None = None
        self._schedule: Schedule1F1B | ScheduleGPipe | None = None
        self._closed = False

    def _new_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return dist.new_group(ranks=[self._global[r] for r in ranks], timeout=self._timeout)

    # ---- what the loop uses ----

    @property
    def batch_size(self) -> int:
        """Samples per step of this rank's pipeline (its inputs and targets)."""
        return self._pipe.batch_size

    @property
    def pipeline_batch_sizes(self) -> tuple[int, ...]:
        """Samples per step of every pipeline; they sum to the global batch."""
        assert self.plan.stages is not None
        return tuple(p.batch_size for p in self.plan.stages.pipelines)

    @property
    def batch_sizes(self) -> None:
        """None: with stages the batches are per pipeline (:attr:`pipeline_batch_sizes`)."""
        return None

    @property
    def first_stage(self) -> bool:
        """This rank runs its pipeline's first stage (its ``train_step`` reads the inputs)."""
        return self._position == 0

    @property
    def last_stage(self) -> bool:
        """This rank runs its pipeline's last stage (its ``train_step`` reads the targets and returns the loss)."""
        return self._position == self._pipe.depth - 1

    def sampler(self, dataset_len: int, **kwargs: Any) -> SplitBatchSampler:
        """This rank's pipeline's samples of every global batch (the same on every rank of a pipeline)."""
        return SplitBatchSampler(dataset_len, self.pipeline_batch_sizes, self.pipeline_index, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedError(
            "a model with pipeline stages is run by model.train_step(inputs, target, loss_fn): this rank holds "
            f"stages {list(self.stages)} only"
        )

    def train_step(self, inputs: torch.Tensor | None, target: Any, loss_fn: LossFn) -> torch.Tensor | None:
        """Forward and backward of this rank's pipeline's batch, then the stage gradients summed over pipelines.

        ``inputs`` (read on the pipeline's first rank) and ``target`` (read on
        its last rank) are the pipeline's ``batch_size`` samples; other ranks
        may pass anything (e.g. the same loader's batch). ``loss_fn(output,
        target)`` must be mean-reduced over the samples. Returns the
        pipeline's mean loss on its last rank, None elsewhere. Call
        ``optimizer.step()`` afterwards.
        """
        if self._closed:
            raise RuntimeCommError(f"rank {self.rank}: this parallelized model was closed")
        b, m = self._pipe.batch_size, self._pipe.batch_size // self._pipe.micro_batches
        B = self.plan.global_batch
        assert B is not None
        for name, value, needed in (("inputs", inputs, self.first_stage), ("target", target, self.last_stage)):
            if needed and (not torch.is_tensor(value) or value.shape[0] != b):
                got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise ValueError(f"train_step: {name} must be this pipeline's {b} samples, got {got}")
        self._loss_fn = loss_fn
        total: torch.Tensor | None = None
        if self._pipe.depth == 1:
            assert inputs is not None and torch.is_tensor(target)
            parts = []
            for xs, ys in zip(inputs.split(m), target.split(m), strict=True):
                loss = loss_fn(self.local(xs), ys) * (m / B)
                loss.backward()
                parts.append(loss.detach().double())
            total = torch.stack(parts).sum()  # on the loss's device
        else:
            schedule = self._schedule or self._make_schedule(m / B)
            losses: list[torch.Tensor] = []
            with _peer_failures(f"pipeline {self.pipeline_index} (rank {self._position} of its {self._pipe.depth})"):
                if self.first_stage:
                    schedule.step(inputs)
                elif self.last_stage:
                    schedule.step(target=target, losses=losses)
                else:
                    schedule.step()
            if self.last_stage:
                parts = [loss.detach().double().reshape(()) for loss in losses]
                device = next((p.device for p in self.local.parameters()), torch.device("cpu"))
                total = torch.stack(parts).sum() if parts else torch.zeros((), dtype=torch.float64, device=device)
        self._reduce()
        return None if total is None else total * (B / b)

    def _make_schedule(self, scale: float) -> Schedule1F1B | ScheduleGPipe:
        # torch.distributed.pipelining runs on gloo and CPU tensors here (batch_isend_irecv between the stages).
        assert self.plan.stages is not None and self._pipe_group is not None

        def scaled(output: Any, target: Any) -> torch.Tensor:
            assert self._loss_fn is not None
            return self._loss_fn(output, target) * scale

        device = next((p.device for p in self.local.parameters()), torch.device("cpu"))
        stage = PipelineStage(self.local, self._position, self._pipe.depth, device, group=self._pipe_group)
        kind = Schedule1F1B if self.plan.stages.schedule == "1f1b" else ScheduleGPipe
        self._schedule = kind(stage, self._pipe.micro_batches, loss_fn=scaled, scale_grads=False)
        return self._schedule

    def _reduce(self) -> None:
        """Each task's stage gradients summed over the stage's holders, in plan order."""
        with torch.no_grad(), startup.peers("summing stage gradients"):
            for group, params, flat in self._syncs:
                offset = 0
                for p in params:
                    view = flat[offset : offset + p.numel()].view_as(p)
                    if p.grad is None:
                        view.zero_()
                    else:
                        view.copy_(p.grad)
                    offset += p.numel()
                dist.all_reduce(flat, group=group)
                offset = 0
                for p in params:
                    view = flat[offset : offset + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = view.clone()
                    else:
                        p.grad.copy_(view)
                    offset += p.numel()

    # ---- state ----

    def owned_state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters and buffers of the children this rank runs, under the full model's names."""
        keep = {str(c) for c in self._children}
        return {k: v for k, v in self.module.state_dict().items() if k.split(".")[0] in keep}

    def sync_buffers(self) -> list[torch.Tensor]:
        """The flat buffers the stage gradients are summed in (memory this rank holds besides the model's)."""
        return [flat for _, _, flat in self._syncs]

    def close(self) -> None:
        """Release this model's process groups where that is safe (:mod:`commsched.transport.groups`), so that
        a process can run again and again without piling them up; idempotent. Nothing runs between steps, so
        nothing is waited for. The model trains no more steps afterwards."""
        groups, self._groups = self._groups, []
        self._closed = True
        self._schedule = None
        if release_groups(groups):
            self._pipe_group = None
            self._syncs = []

    def flush(self) -> None:
        """Nothing is deferred: every step's update is the user's ``optimizer.step()``."""

    @property
    def bound(self) -> BoundStages:
        return self._bound
