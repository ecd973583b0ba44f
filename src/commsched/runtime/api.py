"""``commsched.parallelize``: the two-line change from plain training to scheduled data parallelism."""

from __future__ import annotations

import atexit
import contextlib
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched.runtime.engine import Engine
from commsched.schedule import NetworkEstimate, policy_class
from commsched.trace import Trace

RUNTIME_POLICIES = ("torch_ddp", "ddp", "wfbp", "horovod", "bytescheduler", "prophet", "dear", "no_overlap")


class ParallelModule(nn.Module):
    """Wraps a model like ``DistributedDataParallel`` does (``.module``, ``no_sync()``, same state_dict keys)."""

    def __init__(self, module: nn.Module, engine: Engine) -> None:
        super().__init__()
        self.module = module
        self._engine = engine

    def forward(self, *args: Any, **kwargs: Any) -> Any:
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
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Apply pending updates and stop the communication threads."""
        self._engine.close()


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: str = "dear",
    *,
    process_group: dist.ProcessGroup | None = None,
    max_grad_norm: float | None = None,
    timeout_s: float = 300.0,
    broadcast_buffers: bool = True,
    warmup_iters: int = 2,
    bandwidth_gbps: float | None = None,
    latency_us: float = 0.0,
    trace: bool = False,
    **options: Any,
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

    ``policy="torch_ddp"`` returns ``DistributedDataParallel(model)`` (the
    baseline). ``options`` are the policy's knobs (see ``commsched.schedule.knobs``).
    ``max_grad_norm`` clips the global norm of the averaged gradients.
    ``timeout_s`` bounds every wait: a crashed or hung peer ends training with
    :class:`commsched.errors.RuntimeCommError`.
    """
    if policy not in RUNTIME_POLICIES:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {', '.join(RUNTIME_POLICIES)}")
    if policy == "torch_ddp":
        if options:
            raise ValueError(f"torch_ddp: unknown option(s) {', '.join(sorted(options))}")
        return _torch_ddp(model, optimizer, process_group, max_grad_norm)
    policy_class(policy)
    network = None
    if bandwidth_gbps is not None:
        network = NetworkEstimate(dist.get_world_size(process_group), bandwidth_gbps * 1e9 / 8, latency_us / 1e6)
    engine = Engine(
        model,
        optimizer,
        policy,
        process_group=process_group,
        max_grad_norm=max_grad_norm,
        timeout_s=timeout_s,
        broadcast_buffers=broadcast_buffers,
        warmup_iters=warmup_iters,
        network=network,
        trace=trace,
        options=options,
    )
    atexit.register(_close_at_exit, weakref.ref(engine))
    return ParallelModule(model, engine), optimizer


def _close_at_exit(ref: weakref.ref[Engine]) -> None:
    """A script that never called ``close()`` still stops its threads (and tells its peers) at exit."""
    engine = ref()
    if engine is not None:
        # The process is ending: a dead peer must not turn exit into a traceback.
        with contextlib.suppress(Exception):
            engine.close()


#: ``torch_ddp`` as a ``commsched.schedule`` policy: ``find_unused_parameters=True`` keeps DDP's
#: initial buckets (it does not rebuild them in gradient-ready order), which is ``ddp`` with
#: ``rebuilt=False`` (checked against ``DistributedDataParallel._get_ddp_logging_data()``, torch 2.13).
TORCH_DDP_AS_POLICY: tuple[str, dict[str, Any]] = ("ddp", {"rebuilt": False})


def _torch_ddp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    process_group: dist.ProcessGroup | None,
    max_grad_norm: float | None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    ddp = nn.parallel.DistributedDataParallel(model, process_group=process_group, find_unused_parameters=True)
    if max_grad_norm is not None:
        step = type(optimizer).step

        def clipped_step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            return step(opt, *args, **kwargs)

        # A method of the optimizer, so LR schedulers can wrap it.
        optimizer.step = types.MethodType(clipped_step, optimizer)  # type: ignore[method-assign]
    return ddp, optimizer
