"""Driver #2: a :mod:`commsched.schedule` plan run inside real PyTorch training.

The engine wires the runtime's parts and holds no policy logic and no policy
name: hooks (:mod:`~commsched.runtime.hooks`) turn forward and backward into
events for the :class:`~commsched.runtime.agent.Agent`, which runs the one
:class:`~commsched.schedule.dispatch.Dispatcher` and starts tasks on their
transports; gradients go through :class:`~commsched.runtime.buffers.GradientBuffers`;
``update="step"`` plans leave averaged gradients in ``p.grad`` at the end of
backward (PyTorch DDP's behaviour); ``update="forward"`` plans apply each
layer's update just before its next forward
(:class:`~commsched.runtime.updates.DeferredUpdates`). Until it has measured
the model the engine runs the provisional plan; then rank 0 makes the real one
(:mod:`~commsched.runtime.warmup`). A plan given in is run from the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.runtime import startup, switching, warmup
from commsched.runtime.agent import Agent
from commsched.runtime.batches import gradient_weight, with_batch_sizes
from commsched.runtime.binding import bind_plan
from commsched.runtime.buffers import GradientBuffers
from commsched.runtime.decisions import DecisionChannel
from commsched.runtime.hooks import ComputeTracer, install_hooks
from commsched.runtime.losses import LossLog
from commsched.runtime.replan import DriftPolicy, Replanner
from commsched.runtime.replicas import DEFAULT_EVERY, ReplicaCheck
from commsched.runtime.updates import DeferredUpdates, averaged_square_norm, clip_coefficient, due_layers
from commsched.schedule import CommPlan, NetworkEstimate, provisional_plan
from commsched.trace import Trace
from commsched.transport import Transport, TransportOptions, open_transports, prepare_transport
from commsched.workload import Workload

log = logging.getLogger("commsched")

#: The estimate a provisional plan is made for before anything was measured (10 Gbit/s).
DEFAULT_NETWORK_BYTES_PER_S = 1.25e9

#: Makes the real plan from the measured model and network (on rank 0, after warm-up), avoiding the
#: policies named in its third argument (plans of theirs measured slower than the warm-up's).
Planner = Callable[[Workload, NetworkEstimate, frozenset[str]], CommPlan]


class Engine:
    """Owns one parallelized model's plan, hooks and agent. Built by :func:`commsched.parallelize`."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        policy: str,
        knobs: dict[str, Any],
        planner: Planner,
        plan: CommPlan | None,
        replan: DriftPolicy | None,
        process_group: dist.ProcessGroup | None,
        max_grad_norm: float | None,
        timeout_s: float,
        broadcast_buffers: bool,
        warmup_iters: int,
        network: NetworkEstimate | None,
        trace: bool,
        transport_options: TransportOptions | None = None,
        batch_sizes: tuple[int, ...] | None = None,
        replica_check_every: int = DEFAULT_EVERY,
        qdisc_drops: Callable[[], int] | None = None,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.policy = policy
        self.knobs = knobs
        self.planner = planner
        self.max_grad_norm = max_grad_norm
        self.timeout_s = timeout_s
        self.broadcast_buffers = broadcast_buffers
        self.warmup_iters = warmup_iters
        self.network = network
        #: per-rank batches of the run (every plan adopted carries them), or None: even batches
        self.batch_sizes = batch_sizes
        self.rank = dist.get_rank(process_group)
        self.world = dist.get_world_size(process_group)
        self._params = [p for p in module.parameters() if p.requires_grad]
        #: what a synchronised forward broadcasts from the leader, listed once as DDP lists its buffers (walking
        #: the modules before every forward took 0.04 ms on resnet5m)
        self._synced_buffers = [b for b in module.buffers() if b.is_floating_point() or b.dtype == torch.long]
        self._t0 = time.perf_counter()
        self.trace = Trace(meta={"policy": policy, "source": "measured", "world_size": self.world}) if trace else None
        self._tracer = ComputeTracer(self.trace, self.rank, self._t0) if self.trace is not None else None
        self.losses = LossLog(self.rank, self.trace, self._t0, qdisc_drops)  # bounded-loss transports' records
        self.replicas = ReplicaCheck(replica_check_every)

        control = startup.control_group(process_group, timeout_s)
        plan_json = plan.to_json(indent=None) if plan is not None else None
        mine = startup.fingerprint(module, policy, knobs, plan_json, self.world, warmup_iters, batch_sizes)
        startup.agree(mine, control)
        self._groups: startup.Groups | None = startup.other_groups(process_group, control, timeout_s)
        # Start from identical replicas, as DDP does.
        startup.broadcast_tensors(
            [*module.parameters(), *module.buffers()], self.groups.leader(), self.groups.sync, "broadcasting parameters"
        )

        self._transports: dict[str, Transport] = {}
        self._transport_options = transport_options
        self.agent = Agent(
            self.rank, self.world, self._transport,
            lambda: DecisionChannel(self.groups.control, timeout_s, transport_options),
            timeout_s, self.trace, self._t0,
        )  # fmt: skip
        self.recorder = warmup.Recorder()
        self._iteration = 0  # optimizer steps taken
        self._epoch = 0  # plans adopted
        self._sync = True
        self._require_forward_sync = True
        self._in_backward = False
        self._closed = False
        self._check_first: CommPlan | None = None
        self._orig_step = type(optimizer).step.__get__(optimizer)
        self._orig_state_dict = type(optimizer).state_dict.__get__(optimizer)
        self._handles = install_hooks(module, self._params, self._on_forward_pre, self._on_grad, self.flush)
        self.replanner = Replanner(replan, self.world, measures=self.rank == 0) if replan is not None else None
        if self.replanner is not None and self.rank == 0:
            self.agent.on_transfer = self.replanner.transfer_done
        self._trial: tuple[int, int] | None = None
        self._baseline_iteration = -1
        self._plan_inputs: tuple[Workload, NetworkEstimate] | None = None
        self._warming = plan is None
        self.replans = 0  # plans made again after a drift
        if plan is None:
            self._adopt(provisional_plan(warmup.unmeasured_workload(module), self._network()))
        else:
            self._adopt(plan)
            self._check_first = plan
            self.recorder.active = True

    # ------------------------------------------------------------------ plans

    def _network(self) -> NetworkEstimate:
        return self.network or NetworkEstimate(self.world, DEFAULT_NETWORK_BYTES_PER_S)

    def use_plan(self, plan: CommPlan) -> None:
        """Switch to ``plan`` between two iterations (every rank at the same point): :func:`switching.use_plan`.
        It runs with the run's per-rank batches; a plan naming others is refused before anything changes."""
        switching.use_plan(self, with_batch_sizes(plan, self.batch_sizes))

    def _transport(self, name: str) -> Transport:
        return self._transports[name]

    def _adopt(self, plan: CommPlan) -> None:
        """Run ``plan`` from the next iteration on (every rank adopts the same plan at the same point)."""
        plan = with_batch_sizes(plan, self.batch_sizes)
        live = bind_plan(self.module, plan, self.world)
        with startup.peers("opening the leader's decision channel"):
            self.agent.prepare(plan)  # before anything changes: a failure leaves the old plan in place
        old = getattr(self, "buffers", None)
        if old is not None:  # gradients must not keep the old plan's buffers alive
            for t, p in enumerate(old.params):
                if old.is_view(t):
                    p.grad = p.grad.clone()
        self.plan = plan
        self._tensor_of = {id(p): t for t, p in enumerate(live.params)}
        self._layer_of_module = {id(m): li for li, m in enumerate(live.modules)}
        self._layer_names = [layer.name for layer in plan.workload.layers]
        self._layer_modules = live.modules
        self._tensors_of_layer = live.tensors_of_layer
        for name in sorted({t.transport for t in plan.tasks} - set(self._transports)):
            self._transports.update(open_transports([name], self.groups.data, self.timeout_s, self._transport_options))
        for name in sorted({t.transport for t in plan.tasks}):
            prepare_transport(self._transports[name], [t for t in plan.tasks if t.transport == name])
        self.losses.plan_adopted(plan, self._iteration, self._transports)
        self.buffers = GradientBuffers(plan, live.params, self.world, gradient_weight(self.batch_sizes, self.rank))
        self.updates = DeferredUpdates(self.optimizer, self._orig_step)
        self._instance = -1  # backward passes under this plan, minus one
        self._got_grad = [-1] * len(live.params)
        self._grads_as_views = plan.update == "step"  # p.grad becomes its bucket view as the gradient is ready
        self._epoch += 1
        self.agent.set_plan(plan, self.buffers, self._epoch, self._iteration)
        self._forward_events = self.agent.listens("forward_pre")

    # ------------------------------------------------------------------ forward

    def begin_forward(self) -> None:
        """Before every forward of the wrapper: flush for evaluation, sync buffers."""
        self.check_error()
        if not torch.is_grad_enabled() or not self.module.training:
            self.flush()
        training = self._sync and torch.is_grad_enabled() and self.module.training
        if training and self.replanner is not None:
            self.replanner.iteration_starts(self._iteration)
        if self.broadcast_buffers and self._require_forward_sync and self._synced_buffers:
            startup.broadcast_tensors(
                self._synced_buffers, self.groups.leader(), self.groups.sync, "synchronising buffers"
            )

    def end_forward(self) -> None:
        """DDP syncs buffers before a forward only if the previous one was a synchronised training forward."""
        self._require_forward_sync = torch.is_grad_enabled() and self._sync
        self.recorder.forward_ends()
        if self._tracer is not None:
            self._tracer.forward_ends(self._iteration)

    def _on_forward_pre(self, module: nn.Module) -> None:
        if not torch.is_grad_enabled():
            return
        self.recorder.forward_pre(module)
        layer = self._layer_of_module.get(id(module))
        if layer is None:
            return
        if self._tracer is not None:
            self._tracer.forward_starts(self._layer_names[layer], self._iteration)
        if self._forward_events:
            self.agent.post("forward_pre", layer, self._epoch)
        if layer in self.updates.pending:
            done = self.agent.completions.done
            self._apply(due_layers(layer, self.updates.pending, self.plan.final_tasks_of_layer, done))

    # ------------------------------------------------------------------ backward

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self._sync:
            return
        self.check_error()
        if not self._in_backward:
            self._begin_backward()
        t = self._tensor_of[id(p)]
        if self._got_grad[t] == self._instance:
            # Its first part is already in the buffer (scaled, perhaps on its way): DDP refuses this too.
            raise UnsupportedError(
                f"parameter {self.plan.workload.tensors[t].name!r} received its gradient twice in one backward "
                "(reentrant activation checkpointing, torch.utils.checkpoint(use_reentrant=True), with the "
                "parameter used inside and outside the checkpointed part?); use use_reentrant=False"
            )
        if self._tracer is not None:
            self._tracer.gradient_ready(self._layer_names[self.plan.workload.tensor_layer[t]], self._iteration)
        self.recorder.grad_ready(p)
        self.buffers.fill(t, p.grad)
        if self._grads_as_views:
            self.buffers.attach_view(t)
        self._got_grad[t] = self._instance
        self.agent.post("grad_ready", t, self._epoch)

    def _begin_backward(self) -> None:
        self._in_backward = True
        if self.updates.pending:  # layers the forward skipped still owe last step's update
            self.agent.post("flush", 0, self._epoch)
            self._apply(sorted(self.updates.pending))
        self._instance += 1
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        for t, got in enumerate(self._got_grad):
            if got != self._instance:
                # No gradient in this backward: zeros, unless p.grad is the bucket view, which holds what earlier
                # backward passes left (the same average on every rank: scaled and summed, it comes back).
                view = self.buffers.is_view(t)
                self.buffers.fill(t, self.buffers.params[t].grad if view else None)
                self.agent.post("grad_ready", t, self._epoch)
        self.agent.post("backward_done", 0, self._epoch)
        self._in_backward = False
        if self._tracer is not None:
            self._tracer.backward_ends(self._iteration)
        if self._check_first is not None:
            switching.check_plan_fits(self, self._check_first)
        if self.replanner is not None:
            self.replanner.backward_ends()
        if self.plan.update == "step":
            start, cpu = time.perf_counter(), time.process_time()
            for task in range(len(self.plan.tasks)):
                self._wait(task, self._instance)
            if self._warming and self.world > 1:
                self.recorder.allreduce_s.append(time.perf_counter() - start)
                self.recorder.allreduce_cpu_s.append(time.process_time() - cpu)
                self.recorder.allreduce_messages = len(self.plan.tasks)
            self.buffers.write_averaged_grads([g == self._instance for g in self._got_grad])

    # ------------------------------------------------------------------ step

    def step(self, closure: Callable[[], float] | None = None) -> None:
        if closure is not None:
            raise UnsupportedError("optimizer.step: closures are not supported under commsched.parallelize")
        self.check_error()
        if self.plan.update == "step":
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
            self._orig_step()
        else:
            coef = self._clip_coefficient() if self.max_grad_norm is not None else 1.0
            self.updates.record_step(len(self.plan.workload.layers), self._instance, coef)
        self.agent.post("step", 0, self._epoch)
        self._iteration += 1
        if self._warming and self._iteration == self.warmup_iters - 1:
            self.recorder.active = True  # the last warm-up iteration is measured
        if self._warming and self._iteration == self.warmup_iters:
            self.recorder.active = False
            switching.replan_after_warmup(self)
        elif self.replanner is not None and self._trial is not None and self._iteration == self._trial[1]:
            switching.check_trial(self, self.replanner)
        elif self.replanner is not None and not self._warming and self.replanner.due(self._iteration):
            switching.check_drift(self, self.replanner)
        self.losses.after_step(self._iteration)
        self.replicas.after_step(self)

    def _clip_coefficient(self) -> float:
        """Global-norm clipping factor of the averaged gradients, computed before any layer is updated."""
        assert self.max_grad_norm is not None

        def reduce_shards(sq: torch.Tensor) -> None:
            with startup.peers("reducing the gradient norm"):
                dist.all_reduce(sq, group=self.groups.control)

        sq = averaged_square_norm(self.plan, self.buffers, self._got_grad, self._instance, self._wait, reduce_shards)
        return clip_coefficient(self.max_grad_norm, sq)

    def _apply(self, layers: list[int]) -> None:
        def wait_layer(layer: int, instance: int) -> None:
            for task in self.plan.final_tasks_of_layer[layer]:
                self._wait(task, instance)

        self.updates.apply(layers, self._tensors_of_layer, self.buffers, self._got_grad, wait_layer)

    def flush(self) -> None:
        """Finish all communication and apply every pending update (evaluation, checkpoints)."""
        self.check_error()
        if self.updates.pending:
            self.agent.post("flush", 0, self._epoch)
            self._apply(sorted(self.updates.pending))

    def optimizer_state_dict(self) -> dict[str, Any]:
        self.flush()
        return self._orig_state_dict()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside the block, like DDP's ``no_sync``."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ------------------------------------------------------------------ waiting and closing

    def _wait(self, task: int, instance: int) -> None:
        name = self.plan.tasks[task].name
        start = time.perf_counter()
        self.agent.wait(
            task, instance, self.timeout_s, lambda: f"rank {self.rank}: task {name} of iteration {instance}"
        )
        if self.replanner is not None:
            self.replanner.waited(time.perf_counter() - start)

    def check_error(self) -> None:
        try:
            self.agent.completions.raise_if_failed()
        except RuntimeCommError as exc:
            raise RuntimeCommError(f"rank {self.rank}: {exc}") from exc.__cause__

    @property
    def groups(self) -> startup.Groups:
        """The run's process groups (released by :meth:`close`)."""
        if self._groups is None:
            raise RuntimeCommError(f"rank {self.rank}: this parallelized model was closed")
        return self._groups

    def close(self) -> None:
        """Stop the threads (idempotent). Pending updates are applied first, unless communication failed;
        then the transports and the process groups are released, so that a process can run again and
        again without piling them up (:mod:`commsched.transport.groups`)."""
        if self._closed:
            return
        failed = self.agent.completions.error is not None
        try:
            if not failed:
                self.flush()
        finally:
            self._closed = True
            # After a failure a thread may sit in a transfer until its own time-out: do not wait for it.
            self.agent.close(join_timeout_s=1.0 if failed else self.timeout_s)
            for h in self._handles:
                h.remove()
            for transport in self._transports.values():
                if not failed:
                    transport.close()
            if self.agent.completions.error is None:  # a group with an op in flight is not destroyed
                self._transports.clear()
                if self.groups.release(self.replicas.take_group()):
                    self._groups = None  # a destroyed group lives on until its last reference goes
