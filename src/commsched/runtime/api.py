"""``commsched.parallelize``: the two-line change from plain training to scheduled data parallelism."""

from __future__ import annotations

import atexit
import contextlib
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.runtime.arguments import check_arguments, grad_scaler_refusal, is_number
from commsched.runtime.batches import (
    WeightedAllReduce,
    checked_batch_sizes,
    run_batch_sizes,
    weighted_allreduce_hook,
    with_batch_sizes,
)
from commsched.runtime.binding import bind_plan
from commsched.runtime.engine import Engine, Planner
from commsched.runtime.losses import StepLoss
from commsched.runtime.named import NamedPlanner
from commsched.runtime.pipeline import PipelineModule, staged_refusals
from commsched.runtime.replan import DriftPolicy
from commsched.runtime.replicas import DEFAULT_EVERY, ReplicaCheck, check_every
from commsched.runtime.servers import run_transport_options
from commsched.runtime.switching import AutoPlanner
from commsched.runtime.warmup import WARMUP_ITERS
from commsched.schedule import (
    AUTO,
    LOSSLESS,
    RUNTIME_POLICIES,
    TORCH_DDP,
    CommPlan,
    NetworkEstimate,
    make_knobs,
    policy_class,
    updating_at,
)
from commsched.trace import Trace
from commsched.transport import TransportOptions, check_transports
from commsched.units import gbps_to_bytes_per_s

# Optimizers whose step needs every parameter at once (a closure re-evaluating the loss).


class ParallelModule(nn.Module):
    """Wraps a model like ``DistributedDataParallel`` does (``.module``, ``no_sync()``, same state_dict keys)."""

    def __init__(self, module: nn.Module, engine: Engine) -> None:
        super().__init__()
        self.module = module
        self._engine = engine

    @torch.compiler.disable
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward; ``torch.compile`` of the wrapper leaves it (and the hooks) eager."""
        self._engine.begin_forward()
        try:
            return self.module(*args, **kwargs)
        finally:
            self._engine.end_forward()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside the block; the next synchronised backward reduces them all."""
        with self._engine.no_sync():
            yield

    def flush(self) -> None:
        """Finish communication and apply pending updates (done automatically for eval and state_dict)."""
        self._engine.flush()

    @property
    def trace(self) -> Trace | None:
        """The measured trace (``parallelize(..., trace=True)``), same schema as the simulator's."""
        return self._engine.trace

    @property
    def plan(self) -> CommPlan:
        """The plan in use (the provisional one during warm-up); ``.save(path)`` writes it as a plan file."""
        return self._engine.plan

    def use_plan(self, plan: CommPlan | str | Path) -> None:
        """Run ``plan`` from the next iteration on (call between iterations, on every rank alike)."""
        self._engine.use_plan(plan if isinstance(plan, CommPlan) else CommPlan.load(plan))

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The local batch of every rank (from the plan or ``parallelize(batch_sizes=...)``); None: even."""
        return self._engine.batch_sizes

    @property
    def batch_size(self) -> int | None:
        """This rank's local batch when the run fixes per-rank batches, else None (the loop's own choice)."""
        sizes = self._engine.batch_sizes
        return None if sizes is None else sizes[self._engine.rank]

    @property
    def micro_batch(self) -> int | None:
        """The plan's micro-batch (every rank's batch a multiple of it: :func:`commsched.data.micro_batches`)."""
        return self._engine.plan.micro_batch

    @property
    def engine(self) -> Engine:
        return self._engine

    def loss_records(self) -> list[StepLoss]:
        """What a bounded-loss transport gave up on this rank, one record per iteration, oldest first
        (:mod:`commsched.runtime.losses`; empty for lossless plans). Flushes first, so the last iteration's
        record is complete."""
        engine = self._engine
        engine.flush()
        engine.losses.finish(engine._iteration)
        return list(engine.losses.records)

    @property
    def replica_checks(self) -> ReplicaCheck:
        """The periodic replica check (:mod:`commsched.runtime.replicas`): ``checks``, ``mismatches``."""
        return self._engine.replicas

    def close(self) -> None:
        """Apply pending updates and stop the communication threads."""
        self._engine.close()


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: str = "dear",
    *,
    plan: CommPlan | str | Path | None = None,
    process_group: dist.ProcessGroup | None = None,
    max_grad_norm: float | None = None,
    timeout_s: float = 300.0,
    broadcast_buffers: bool = True,
    warmup_iters: int = WARMUP_ITERS,
    bandwidth_gbps: float | None = None,
    latency_us: float = 0.0,
    trace: bool = False,
    grad_scaler: torch.amp.GradScaler | None = None,
    auto_budget_s: float = 5.0,
    replan: DriftPolicy | bool | None = None,
    transport_options: TransportOptions | None = None,
    batch_sizes: Sequence[int] | None = None,
    replica_check_every: int = DEFAULT_EVERY,
    qdisc_drops: Callable[[], int] | None = None,
    **knobs: Any,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Make ``model`` and ``optimizer`` train data-parallel under a communication policy.

    Example::

        model, optimizer = commsched.parallelize(model, optimizer, policy="dear", threshold_mb=25)
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()

    Every lossless policy gives the same parameters as PyTorch DDP (up to float
    summation order) with any per-parameter ``torch.optim`` optimizer. The first
    ``warmup_iters`` iterations all-reduce everything after backward while rank 0
    records the real forward order, gradient-ready times and bandwidth; the
    policy's plan is built from them and used from then on.

    ``plan``: a :class:`~commsched.schedule.CommPlan` or a plan file (``commsched
    simulate ... --save-plan``) to run instead of a policy by name; it must fit
    the model (parameter names and shapes) and the world size, skips the
    warm-up, and the first iteration checks that the model runs in the plan's
    order. A plan with pipeline stages (``commsched plan`` makes them when the
    model does not fit a device) returns a
    :class:`~commsched.runtime.pipeline.PipelineModule` instead: an
    ``nn.Sequential`` model, trained by ``model.train_step(x, y, loss_fn)``.
    ``policy="torch_ddp"`` returns ``DistributedDataParallel(model)`` (the baseline).
    ``knobs`` are the policy's (``commsched.schedule.knob_class(policy)``).
    ``max_grad_norm`` clips the global norm of the averaged gradients.
    ``grad_scaler``: the ``torch.amp.GradScaler`` the loop will use, so a policy
    that cannot take one is refused now rather than at its first step.

    ``policy="auto"``: after the warm-up, rank 0 runs the search of ``commsched
    advise`` (every lossless policy with its knobs searched, simulated on the
    measured model and network) within ``auto_budget_s`` seconds, logs the
    choice and its predicted time (logger ``commsched``), measures the winner
    and the runner-up for a few iterations each, and every rank runs the
    faster (``model.plan`` says which). With a ``grad_scaler`` only policies
    that update at ``step()`` compete. ``replan`` (default: on for ``auto``, off
    otherwise; a :class:`~commsched.runtime.replan.DriftPolicy` to tune it) keeps
    measuring compute and bandwidth and makes the plan again, on every rank at
    the same iteration, when they drift.
    ``batch_sizes``: the local batch of every rank (one whole number >= 1 per
    rank; a plan may carry them instead, ``commsched plan -o``). Rank ``r``'s
    gradient is then weighted by ``b_r / B`` and the ranks' gradients summed, so
    a mean-reduced loss trains exactly as one process on the global batch ``B``;
    ``model.batch_size`` is this rank's batch (size the loader with
    :class:`commsched.data.SplitBatchSampler`). Without them every rank is
    assumed to have the same batch and gradients are averaged, as under DDP.
    ``transport_options``: where a socket transport (parameter server,
    bounded-loss) binds and how it authenticates
    (:class:`~commsched.transport.TransportOptions`, ``servers=``: the ranks that run
    parameter servers; a plan may name them); the collectives ignore it.
    ``timeout_s`` bounds every wait: a crashed or hung peer ends training with
    :class:`commsched.errors.RuntimeCommError`.
    ``replica_check_every`` (default 50; 0: never): how often a plan whose
    delivered results may differ between ranks (a lossy pull) compares the
    ranks' parameters and optimizer state and re-broadcasts rank 0's on a
    difference (:mod:`commsched.runtime.replicas`); lossless plans never check.
    ``qdisc_drops``: a counter of packets the network's queues dropped (e.g. a
    testbed's switch ports), read into the loss records of a bounded-loss
    transport (``model.loss_records()``, :mod:`commsched.runtime.losses`).

    Every bad argument raises here, before any communication: an unknown
    policy, a knob's name, type or range, an optimizer or scaler the policy
    cannot use, a plan that does not fit.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeCommError("parallelize: torch.distributed is not initialised; call init_process_group first")
    check_arguments(model, optimizer, max_grad_norm, timeout_s, warmup_iters, bandwidth_gbps, latency_us)
    check_every(replica_check_every)
    if qdisc_drops is not None and not callable(qdisc_drops):
        raise ValueError(f"qdisc_drops: must be a callable returning a count, got {qdisc_drops!r}")
    world = dist.get_world_size(process_group)
    devices = {p.device for p in model.parameters()}
    if plan is not None:
        if knobs:
            raise ValueError(f"parallelize: knobs come from the plan; got {', '.join(sorted(knobs))} as well")
        plan = plan if isinstance(plan, CommPlan) else CommPlan.load(plan)
        if plan.stages is not None:
            refused = staged_refusals(max_grad_norm, grad_scaler, batch_sizes, trace)
            if refused:
                raise UnsupportedError(refused)
            return PipelineModule(model, plan, process_group, timeout_s), optimizer  # type: ignore[arg-type]
        policy = plan.policy
        bind_plan(model, plan, world)
        check_transports((t.transport for t in plan.tasks), devices)
        plan = with_batch_sizes(plan, run_batch_sizes(plan, batch_sizes, world))
        knob_values = plan.knobs.to_dict()
    elif policy == TORCH_DDP:
        if knobs:
            raise ValueError(f"{TORCH_DDP}: takes no knobs, got {', '.join(sorted(knobs))}")
        sizes = None if batch_sizes is None else checked_batch_sizes(batch_sizes, world)
        return _torch_ddp(model, optimizer, process_group, max_grad_norm, sizes)
    elif policy not in RUNTIME_POLICIES:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {', '.join(RUNTIME_POLICIES)}")
    elif policy == AUTO:
        if knobs:
            raise ValueError(f"{AUTO}: knobs are searched, not given; got {', '.join(sorted(knobs))}")
        if not (is_number(auto_budget_s) and auto_budget_s > 0):
            raise ValueError(f"auto_budget_s: must be a finite number > 0, got {auto_budget_s!r}")
        knob_values = {"budget_s": auto_budget_s}
    else:
        made = make_knobs(policy, knobs)
        check_transports(policy_class(policy).transports(made), devices)  # a transport that cannot run: now
        knob_values = made.to_dict()
    # auto may choose a deferring policy unless told of a scaler: a scaler it was not told of is refused.
    defers = True if policy == AUTO else policy_class(policy).update_mode == "forward"
    if grad_scaler is not None and policy != AUTO and defers:
        raise UnsupportedError(grad_scaler_refusal(policy))
    on_cpu = all(d.type == "cpu" for d in devices)
    on_gloo = "gloo" in str(dist.get_backend(process_group)) and on_cpu
    if policy == AUTO:
        step_only = tuple(n for n in updating_at("step") if n in LOSSLESS)
        choices = step_only if grad_scaler is not None else None
        defers = grad_scaler is None
        planner: Planner = AutoPlanner(auto_budget_s, choices, gloo=on_gloo, host_memory=on_cpu)
    else:
        planner = NamedPlanner(policy, knob_values, gloo=on_gloo, host_memory=on_cpu)
    if replan is None:
        replan = policy == AUTO
    drift = (DriftPolicy() if replan is True else replan) or None
    network = None
    if bandwidth_gbps is not None:
        network = NetworkEstimate(world, gbps_to_bytes_per_s(bandwidth_gbps), latency_us / 1e6)
    run_sizes = plan.batch_sizes if plan is not None else run_batch_sizes(None, batch_sizes, world)
    transport_options = run_transport_options(plan, transport_options, world)
    engine = Engine(
        model,
        optimizer,
        policy=policy,
        knobs=knob_values,
        planner=planner,
        replan=drift,
        plan=plan,
        process_group=process_group,
        max_grad_norm=max_grad_norm,
        timeout_s=timeout_s,
        broadcast_buffers=broadcast_buffers,
        warmup_iters=warmup_iters,
        network=network,
        trace=trace,
        transport_options=transport_options,
        batch_sizes=run_sizes,
        replica_check_every=replica_check_every,
        qdisc_drops=qdisc_drops,
    )
    _patch_optimizer(optimizer, engine, policy, defers)
    atexit.register(_close_at_exit, weakref.ref(engine))
    return ParallelModule(model, engine), optimizer


#: Why a compiled model is refused: the runtime works through module hooks and gradient hooks, which a
#: compiled graph runs (or drops) on its own terms; compile the model inside instead.
def _patch_optimizer(optimizer: torch.optim.Optimizer, engine: Engine, policy: str, defers: bool) -> None:
    """``step`` and ``state_dict`` go through the engine; bound to the optimizer so LR schedulers can wrap them."""

    def step(opt: torch.optim.Optimizer, closure: Callable[[], float] | None = None, **kwargs: Any) -> None:
        if "grad_scaler" in kwargs or getattr(opt, "grad_scale", None) is not None:
            raise UnsupportedError(grad_scaler_refusal(policy))
        engine.step(closure)

    def state_dict(opt: torch.optim.Optimizer) -> dict[str, Any]:
        return engine.optimizer_state_dict()

    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    optimizer.state_dict = types.MethodType(state_dict, optimizer)  # type: ignore[method-assign]
    # A GradScaler hands itself to optimizers that claim to handle scaling: a deferring policy refuses it.
    optimizer._step_supports_amp_scaling = defers  # type: ignore[attr-defined]


def _close_at_exit(ref: weakref.ref[Engine]) -> None:
    """A script that never called ``close()`` still stops its threads (and tells its peers) at exit."""
    engine = ref()
    if engine is not None:
        # The process is ending: a dead peer must not turn exit into a traceback.
        with contextlib.suppress(Exception):
            engine.close()


def _torch_ddp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    process_group: dist.ProcessGroup | None,
    max_grad_norm: float | None,
    batch_sizes: tuple[int, ...] | None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    ddp = nn.parallel.DistributedDataParallel(model, process_group=process_group, find_unused_parameters=True)
    if batch_sizes is not None:  # per-rank batches: a weighted sum instead of DDP's mean
        weight = batch_sizes[dist.get_rank(process_group)] / sum(batch_sizes)
        ddp.register_comm_hook(WeightedAllReduce(process_group, weight), weighted_allreduce_hook)
    if max_grad_norm is not None:
        step = type(optimizer).step

        def clipped_step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            return step(opt, *args, **kwargs)

        # A method of the optimizer, so LR schedulers can wrap it.
        optimizer.step = types.MethodType(clipped_step, optimizer)  # type: ignore[method-assign]
    return ddp, optimizer
