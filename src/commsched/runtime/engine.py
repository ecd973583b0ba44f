"""Driver #2: runs a :mod:`commsched.schedule` policy inside real PyTorch training.

The engine turns training into the contract's event stream and executes the
policy's actions; it contains no policy decisions.

Threads and order:

* The **training thread** (forward pre-hooks, gradient hooks, ``step()``) posts
  events to a FIFO queue and, where the plan says so, blocks until the tasks
  carrying a layer's gradients have finished.
* One **agent thread** per process feeds the events to the scheduler and issues
  the collectives, strictly in action order, on a process group of its own. A
  launch waits until its inputs are ready on this rank. For policies whose
  decisions depend on completions (``uses_completions``), only rank 0's agent
  runs the scheduler; it sends each decision to the other ranks over a control
  group, so every rank issues the same collectives in the same order.
* A **watcher thread** waits for launched tasks in launch order and reports
  completions (and records them in the trace).

Gradients: each task owns a flat buffer. When a gradient is ready it is copied
into the buffers of the tasks that read it; a finished all-reduce or all-gather
is averaged and unpacked. With ``update="step"`` the end of backward waits for
every task and leaves averaged gradients in ``p.grad`` (PyTorch DDP's
behaviour). With ``update="forward"``, ``optimizer.step()`` records the
hyper-parameters in force and each layer's update runs just before its next
forward, with the user's optimizer restricted to that layer's parameters.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.runtime.collectives import Collectives, Handle
from commsched.schedule import Launch, NetworkEstimate, Plan, Scheduler, Wait, build_plan, policy_class
from commsched.trace import Trace, TraceEvent
from commsched.workload import Layer, Provenance, Tensor, Workload

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}

# Optimizers whose step needs every parameter at once (a closure re-evaluating the loss).
_UNSPLITTABLE = ("LBFGS",)


@dataclass
class _Slot:
    """Where one task's data lives: a flat buffer (padded) and, for RS/AG pairs, a shard."""

    flat: torch.Tensor
    shard: torch.Tensor | None = None
    offsets: list[int] = field(default_factory=list)  # start of each segment in ``flat``


@dataclass
class _Launched:
    handle: Handle
    gen: int
    start_s: float


class Engine:
    """Owns hooks, buffers, threads and the scheduler of one parallelized model."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        policy: str,
        *,
        process_group: dist.ProcessGroup | None = None,
        max_grad_norm: float | None = None,
        timeout_s: float = 300.0,
        broadcast_buffers: bool = True,
        warmup_iters: int = 2,
        network: NetworkEstimate | None = None,
        trace: bool = False,
        options: dict[str, Any] | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeCommError("parallelize: torch.distributed is not initialised; call init_process_group first")
        if type(optimizer).__name__ in _UNSPLITTABLE:
            raise UnsupportedError(
                f"optimizer: {type(optimizer).__name__} needs every parameter at once (closure); "
                "commsched applies updates per layer, use a per-parameter optimizer such as SGD or AdamW"
            )
        if max_grad_norm is not None and not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm: must be a finite number > 0, got {max_grad_norm!r}")
        if warmup_iters < 1:
            raise ValueError(f"warmup_iters: must be >= 1, got {warmup_iters!r}")
        self.policy = policy
        self.scheduler_cls = policy_class(policy)
        self.options = dict(options or {})
        self.module = module
        self.optimizer = optimizer
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world = dist.get_world_size(process_group)
        self.max_grad_norm = max_grad_norm
        self.timeout_s = timeout_s
        self.broadcast_buffers = broadcast_buffers
        self.warmup_iters = warmup_iters
        self.network = network
        self.trace = Trace(meta={"policy": policy, "source": "measured", "world_size": self.world}) if trace else None
        self._t0 = time.perf_counter()

        # ---- parameters: unique, trainable, grouped by their first owning module ----
        # A shared (tied) parameter belongs to the first module that runs it in forward; until
        # the order is recorded, to the first that holds it.
        self._holders: dict[int, list[nn.Module]] = {}
        names: dict[int, str] = {}
        for mname, mod in module.named_modules(remove_duplicate=False):
            for pname, p in mod.named_parameters(recurse=False):
                if p.requires_grad and mod not in self._holders.setdefault(id(p), []):
                    self._holders[id(p)].append(mod)
                    names.setdefault(id(p), f"{mname}.{pname}" if mname else pname)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._param_name = names
        self._modules = list(dict.fromkeys(m for p in self._params for m in self._holders[id(p)]))
        self._module_names = {id(m): n for n, m in module.named_modules()}
        # Every module with parameters below it gets a forward pre-hook: a module whose parameters
        # are used by a parent without calling its forward (e.g. MultiheadAttention.out_proj)
        # is updated when that parent starts.
        self._hooked = [m for m in module.modules() if any(True for _ in m.parameters())]

        # ---- process groups: data collectives on the agent thread, control on its own ----
        timeout = timedelta(seconds=timeout_s)
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        self._data_pg = dist.new_group(ranks=ranks, timeout=timeout)
        self._ctrl_pg = dist.new_group(ranks=ranks, timeout=timeout, backend="gloo")
        self._coll = Collectives(self._data_pg, timeout_s=timeout_s)

        # Start from identical replicas, as DDP does.
        with torch.no_grad():
            for t in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(
                    t.data, src=dist.get_global_rank(process_group, 0) if process_group else 0, group=process_group
                )

        # ---- per-iteration state ----
        self._iteration = 0  # number of optimizer steps taken
        self._gen = 0  # number of backward passes begun
        self._in_backward = False
        self._sync = True
        self._require_forward_sync = True
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._ready_gen: list[int] = []
        self._got_grad_gen: list[int] = []
        self._launched: dict[int, _Launched] = {}
        self._pending: dict[int, int] = {}  # layer -> gen of the gradients waiting to be applied
        self._hyper: list[dict[str, Any]] = []
        self._clip_coef = 1.0
        # trace: the compute interval still open, as [kind, layer, start, end]
        self._open_compute: list[Any] | None = None
        self._forward_order: list[int] = []  # positions in self._hooked, first-call order (recorded)
        self._forward_times: dict[int, float] = {}
        self._ready_times: dict[int, float] = {}
        self._ar_seconds: list[float] = []

        self._install_hooks()
        self._orig_step = type(optimizer).step.__get__(optimizer)
        self._orig_state_dict = type(optimizer).state_dict.__get__(optimizer)
        # Bound to the optimizer (not to the engine): LR schedulers re-bind ``step.__func__`` to it.
        engine = self

        def step(opt: torch.optim.Optimizer, closure: Callable[[], float] | None = None, **kwargs: Any) -> None:
            if "grad_scaler" in kwargs or getattr(opt, "grad_scale", None) is not None:
                raise UnsupportedError(
                    f"GradScaler: {engine.policy} applies updates after step() returns, when the scaler has "
                    "moved on; use bf16 autocast (no scaler needed) or a policy that updates at step() "
                    "(ddp, wfbp, horovod, no_overlap)"
                )
            engine._step(closure)

        def state_dict(opt: torch.optim.Optimizer) -> dict[str, Any]:
            return engine._optimizer_state_dict()

        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        optimizer.state_dict = types.MethodType(state_dict, optimizer)  # type: ignore[method-assign]

        self._events: queue.Queue[tuple[str, int, int] | None] = queue.Queue()
        self._synced = threading.Event()
        self._agent_gen = 0
        self._done_q: queue.Queue[tuple[Any, _Launched] | None] = queue.Queue()
        self._setup_plan(self._provisional_workload(), "no_overlap", {})
        self._agent = threading.Thread(target=self._guard(self._agent_loop), name="commsched-agent", daemon=True)
        self._watcher = threading.Thread(target=self._guard(self._watch_loop), name="commsched-watch", daemon=True)
        self._agent.start()
        self._watcher.start()

    # ------------------------------------------------------------------ plan

    def _provisional_workload(self) -> Workload:
        return self._workload(list(range(len(self._modules))), {}, {})

    def _workload(
        self,
        order: list[int],
        fwd_ms: dict[int, float],
        ready_ms: dict[int, float],
        triggers: dict[int, int] | None = None,
    ) -> Workload:
        """A Workload of the live model: layers in ``order``, tensors as registered."""
        self._layer_modules = [self._modules[i] for i in order]
        self._layers_of_hook: dict[int, list[int]] = {}
        for li, pos in enumerate(order):
            trigger = self._hooked.index(self._modules[pos]) if triggers is None else triggers[pos]
            self._layers_of_hook.setdefault(trigger, []).append(li)
        rank_of = {id(m): k for k, m in enumerate(self._layer_modules)}
        first = {id(p): min(self._holders[id(p)], key=lambda m: rank_of[id(m)]) for p in self._params}
        self._params_of_module = {id(m): [p for p in self._params if first[id(p)] is m] for m in self._modules}
        self._tensor_params: list[nn.Parameter] = []
        layers = []
        for pos in order:
            mod = self._modules[pos]
            ps = self._params_of_module[id(mod)]
            tensors = []
            ready = []
            for p in ps:
                tensors.append(
                    Tensor(
                        name=self._param_name[id(p)],
                        numel=p.numel(),
                        dtype=_DTYPE_NAMES.get(p.dtype, "fp32"),
                        shape=tuple(p.shape),
                    )
                )
                ready.append(ready_ms.get(id(p), 0.0))
                self._tensor_params.append(p)
            layers.append(
                Layer(
                    name=self._module_names.get(id(mod), "") or type(mod).__name__,
                    tensors=tuple(tensors),
                    forward_ms=fwd_ms.get(pos, 0.0),
                    backward_ms=0.0,
                    grad_ready_ms=tuple(ready) if ready_ms else None,
                )
            )
        self._tensor_of_param = {id(p): ti for ti, p in enumerate(self._tensor_params)}
        return Workload(
            model=type(self.module).__name__,
            batch_size=1,
            device=str(self._params[0].device),
            layers=tuple(layers),
            provenance=Provenance(kind="measured", source="commsched.runtime warm-up"),
        )

    def _setup_plan(self, workload: Workload, policy: str, options: dict[str, Any]) -> None:
        network = self.network or NetworkEstimate(self.world, 1.25e9)
        self.plan: Plan = build_plan(policy, workload, network, **options)
        self.scheduler: Scheduler | None = policy_class(policy)(self.plan)
        self._leader_decides = policy_class(policy).uses_completions and self.world > 1
        if self._leader_decides and self.rank != 0:
            self.scheduler = None  # followers replay rank 0's decisions
        n = len(workload.tensors)
        self._ready_gen = [-1] * n
        self._got_grad_gen = [-1] * n
        self._launched = {}
        self._slots = [self._make_slot(task) for task in self.plan.tasks]
        # RS/AG pairs share one buffer: the all-gather writes back where the reduce-scatter read.
        for task in self.plan.tasks:
            if task.kind == "all_gather":
                self._slots[task.id] = self._slots[task.deps[0]]
        self._active_policy = policy
        # GradScaler hands itself to optimizers that claim to handle scaling: deferred updates refuse it.
        self.optimizer._step_supports_amp_scaling = self.plan.update == "forward"  # type: ignore[attr-defined]

    def _make_slot(self, task: Any) -> _Slot:
        p0 = self._tensor_params[task.segments[0].tensor]
        offsets, total = [], 0
        for seg in task.segments:
            offsets.append(total)
            total += seg.numel
        if task.kind in ("reduce_scatter", "all_gather"):
            padded = -(-total // self.world) * self.world
            flat = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
            return _Slot(flat, torch.zeros(padded // self.world, dtype=p0.dtype, device=p0.device), offsets)
        return _Slot(torch.zeros(total, dtype=p0.dtype, device=p0.device), None, offsets)

    def _replan(self) -> None:
        """After the warm-up: rank 0's measured order and timings, shared, define the real plan."""
        payload: list[Any] = [None]
        if self.rank == 0:
            called = {h: k for k, h in enumerate(dict.fromkeys(self._forward_order))}
            triggers = {pos: self._trigger_of(mod, called) for pos, mod in enumerate(self._modules)}
            never = len(self._hooked)  # modules used by nothing that ran: at the end
            order = sorted(range(len(self._modules)), key=lambda pos: (called.get(triggers[pos], never), pos))
            ready = self._ready_by_index()
            times = [self._forward_times[triggers[pos]] for pos in order if triggers[pos] in self._forward_times]
            fwd_ms = {pos: (b - a) * 1e3 for pos, a, b in zip(order, times, times[1:], strict=False)}
            bw = None
            if self._ar_seconds and self.world > 1:
                nbytes = sum(p.numel() * p.element_size() for p in self._params)
                bw = 2 * (self.world - 1) / self.world * nbytes / max(min(self._ar_seconds), 1e-9)
            payload = [(order, triggers, fwd_ms, ready, bw)]
        with self._peers("sharing the warm-up profile"):
            dist.broadcast_object_list(payload, src=0, group=self._ctrl_pg)
        order, triggers, fwd, ready_idx, bw = payload[0]
        if self.network is None and bw is not None:
            self.network = NetworkEstimate(self.world, bw)
        ready = {id(self._params[i]): t for i, t in ready_idx.items()}
        # Let the agent finish the warm-up's events before its plan changes under it.
        self._synced.clear()
        self._events.put(("sync", 0, self._gen))
        if not self._synced.wait(self.timeout_s):
            raise RuntimeCommError(f"rank {self.rank}: communication thread did not reach the plan switch")
        self._setup_plan(self._workload(order, fwd, ready, triggers), self.policy, self.options)
        self._events.put(("resume", 0, self._gen))

    def _trigger_of(self, mod: nn.Module, called: dict[int, int]) -> int:
        """The hooked module whose forward start applies ``mod``'s update: itself, else its nearest called ancestor."""
        idx = self._hooked.index(mod)
        if idx in called:
            return idx
        name = self._module_names.get(id(mod), "")
        while "." in name:
            name = name.rsplit(".", 1)[0]
            parent = self.module.get_submodule(name)
            if parent in self._hooked and self._hooked.index(parent) in called:
                return self._hooked.index(parent)
        return idx

    def _ready_by_index(self) -> dict[int, float]:
        """Measured gradient-ready offsets (ms from the first), keyed by position in ``self._params``."""
        if not self._ready_times:
            return {}
        t0 = min(self._ready_times.values())
        return {
            i: (self._ready_times[id(p)] - t0) * 1e3 for i, p in enumerate(self._params) if id(p) in self._ready_times
        }

    # ----------------------------------------------------------------- hooks

    def _install_hooks(self) -> None:
        self._handles = []
        for pos, mod in enumerate(self._hooked):
            self._handles.append(mod.register_forward_pre_hook(self._make_pre_hook(pos)))
        for p in self._params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._handles.append(self.module.register_state_dict_pre_hook(lambda *_a, **_k: self.flush()))

    def _make_pre_hook(self, pos: int) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any) -> None:
            self._on_forward_pre(pos, mod)

        return hook

    def _recording(self) -> bool:
        """The last warm-up iteration records forward order and gradient-ready times."""
        return self._iteration == self.warmup_iters - 1 and self._active_policy == "no_overlap"

    def begin_forward(self) -> None:
        """Called by the wrapper before every forward: flush for evaluation, sync buffers."""
        self._check_error()
        if not torch.is_grad_enabled() or not self.module.training:
            self.flush()
        if self.broadcast_buffers and self._require_forward_sync:
            bufs = [b for b in self.module.buffers() if b.is_floating_point() or b.dtype == torch.long]
            if bufs:
                src = dist.get_global_rank(self.group, 0) if self.group else 0
                flat = torch.cat([b.detach().reshape(-1).to(torch.float64) for b in bufs])
                with self._peers("synchronising buffers"):
                    dist.broadcast(flat, src=src, group=self.group)
                with torch.no_grad():
                    offset = 0
                    for b in bufs:
                        b.copy_(flat[offset : offset + b.numel()].view_as(b).to(b.dtype))
                        offset += b.numel()

    def end_forward(self) -> None:
        """DDP syncs buffers before a forward only if the previous forward was a synchronised training one."""
        self._require_forward_sync = torch.is_grad_enabled() and self._sync
        if self.trace is not None and self._open_compute is not None and self._open_compute[0] == "forward":
            end = self._close_compute(time.perf_counter())
            self._open_compute = ["backward", -1, end, end]  # backward (and the loss) start here

    def _on_forward_pre(self, pos: int, mod: nn.Module) -> None:
        if not torch.is_grad_enabled():
            return
        now = time.perf_counter()
        if self._recording() and pos not in self._forward_times:
            self._forward_order.append(pos)
            self._forward_times[pos] = now
        if self.trace is not None:
            layers = self._layers_of_hook.get(pos, ())
            if layers:
                self._trace_compute("forward", layers[0], now, starts=True)
        for layer in self._layers_of_hook.get(pos, ()):
            self._post("forward_pre", layer)
            if layer in self._pending:
                self._apply_pending([layer])

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        self._check_error()
        if not self._in_backward:
            self._begin_backward()
        t = self._tensor_of_param[id(p)]
        if self.trace is not None:
            # The backward interval that ends at a layer's last gradient is that layer's.
            self._trace_compute("backward", self.plan.workload.tensor_layer[t], time.perf_counter(), starts=False)
        if self._recording():
            self._ready_times[id(p)] = time.perf_counter()
        self._fill(t, p.grad)
        self._got_grad_gen[t] = self._gen
        self._mark_ready(t)
        self._post("grad_ready", t)

    def _trace_compute(self, kind: str, layer: int, now: float, *, starts: bool) -> None:
        """Extend or close the open compute interval.

        ``starts=True``: ``layer`` begins at ``now`` (forward pre-hooks). ``starts=False``: ``layer``'s
        work ends at ``now`` (gradient hooks), so the interval since the previous mark is ``layer``'s.
        """
        open_ = self._open_compute
        if open_ is not None and open_[0] == kind and open_[1] == layer:
            if not starts:
                open_[3] = now
            return
        start = self._close_compute(now if starts or open_ is None else open_[3])
        self._open_compute = [kind, layer, now, None] if starts else [kind, layer, start, now]

    def _close_compute(self, now: float) -> float:
        """Record the open interval (ending at ``now`` unless it has its own end); return where it ended."""
        open_ = self._open_compute
        self._open_compute = None
        if open_ is None or self.trace is None:
            return now
        kind, layer, start, end = open_
        end = now if end is None else end
        if layer < 0:  # only a mark: where the next interval starts
            return end
        self.trace.add(
            TraceEvent(
                self.plan.workload.layers[layer].name, kind, self.rank, start - self._t0, end - self._t0,
                0, self._iteration,
            )
        )  # fmt: skip
        return end

    def _begin_backward(self) -> None:
        self._in_backward = True
        if self._pending:  # layers the forward skipped still owe last step's update
            self._post("flush", 0)
            self._apply_pending(sorted(self._pending))
        self._gen += 1
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        for t in range(len(self._tensor_params)):
            if self._ready_gen[t] != self._gen:  # no gradient this iteration: reduce zeros
                self._fill(t, None)
                self._mark_ready(t)
                self._post("grad_ready", t)
        self._post("backward_done", 0)
        self._in_backward = False
        if self.trace is not None:
            self._close_compute(time.perf_counter())
        if self.plan.update == "step":
            start = time.perf_counter()
            for task in self.plan.tasks:
                self._wait_task(task.id, self._gen)
            if self._active_policy == "no_overlap" and self.world > 1:
                self._ar_seconds.append(time.perf_counter() - start)
            # Averaged straight from the task buffers into p.grad: one pass, no temporaries.
            for task in self.plan.tasks:
                slot = self._slots[task.id]
                for seg, off in zip(task.segments, slot.offsets, strict=True):
                    p = self._tensor_params[seg.tensor]
                    if self._got_grad_gen[seg.tensor] != self._gen or p.grad is None:
                        continue
                    if p.grad.is_contiguous():
                        dst = p.grad.view(-1)[seg.start : seg.stop]
                        torch.div(slot.flat[off : off + seg.numel], self.world, out=dst)
                    else:  # e.g. channels_last: go through a contiguous copy
                        flat_grad = p.grad.reshape(-1).clone()
                        torch.div(slot.flat[off : off + seg.numel], self.world, out=flat_grad[seg.start : seg.stop])
                        p.grad.copy_(flat_grad.view_as(p.grad))

    # ------------------------------------------------------------- data flow

    def _fill(self, t: int, grad: torch.Tensor | None) -> None:
        for task_id in self.plan.tasks_reading_tensor[t]:
            task = self.plan.tasks[task_id]
            slot = self._slots[task_id]
            for seg, off in zip(task.segments, slot.offsets, strict=True):
                if seg.tensor != t:
                    continue
                dst = slot.flat[off : off + seg.numel]
                if grad is None:
                    dst.zero_()
                else:
                    dst.copy_(grad.detach().reshape(-1)[seg.start : seg.stop])

    def _averaged(self, t: int) -> torch.Tensor:
        """The reduced gradient of tensor ``t`` divided by the world size (call after its tasks finished)."""
        p = self._tensor_params[t]
        out = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
        for task_id in self.plan.final_tasks_of_tensor[t]:
            task = self.plan.tasks[task_id]
            slot = self._slots[task_id]
            for seg, off in zip(task.segments, slot.offsets, strict=True):
                if seg.tensor == t:
                    out[seg.start : seg.stop] = slot.flat[off : off + seg.numel]
        return out.div_(self.world)

    def _mark_ready(self, t: int) -> None:
        with self._cond:
            self._ready_gen[t] = self._gen
            self._cond.notify_all()

    # --------------------------------------------------------------- updates

    def _step(self, closure: Callable[[], float] | None = None) -> None:
        if closure is not None:
            raise UnsupportedError("optimizer.step: closures are not supported under commsched.parallelize")
        self._check_error()
        if self.plan.update == "step":
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
            self._orig_step()
        else:
            self._hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            self._clip_coef = self._clip_coefficient() if self.max_grad_norm is not None else 1.0
            self._pending = dict.fromkeys(range(len(self._layer_modules)), self._gen)
        self._post("step", 0)
        self._iteration += 1
        if self._iteration == self.warmup_iters and self._active_policy == "no_overlap":
            self._replan()

    def _clip_coefficient(self) -> float:
        """Global-norm clipping factor of the averaged gradients, computed before any layer is updated."""
        assert self.max_grad_norm is not None
        sq = torch.zeros((), dtype=torch.float64)
        rs = [task for task in self.plan.tasks if task.kind == "reduce_scatter"]
        if rs:  # this rank's reduce-scatter shards (sums over ranks), then one scalar all-reduce
            for task in rs:
                self._wait_task(task.id, self._gen)
                shard = self._slots[task.id].shard
                assert shard is not None
                sq += shard.double().div(self.world).pow(2).sum()
            with self._peers("reducing the gradient norm"):
                dist.all_reduce(sq, group=self._ctrl_pg)
        else:
            for t in range(len(self._tensor_params)):
                if self._got_grad_gen[t] == self._gen:
                    for task_id in self.plan.final_tasks_of_tensor[t]:
                        self._wait_task(task_id, self._gen)
                    sq += self._averaged(t).double().pow(2).sum()
        norm = math.sqrt(float(sq))
        return min(1.0, self.max_grad_norm / (norm + 1e-6))

    def _apply_pending(self, layers: Sequence[int]) -> None:
        """Apply last step's update to ``layers`` (forward mode), with that step's hyper-parameters."""
        todo = [li for li in layers if li in self._pending]
        if not todo:
            return
        params: list[torch.Tensor] = []
        saved: list[tuple[nn.Parameter, torch.Tensor | None]] = []
        for li in todo:
            gen = self._pending.pop(li)
            for task_id in self.plan.final_tasks_of_layer[li]:
                self._wait_task(task_id, gen)
            for p in self._params_of_module[id(self._layer_modules[li])]:
                t = self._tensor_of_param[id(p)]
                if self._got_grad_gen[t] != gen:
                    continue  # unused this iteration: the optimizer skips it, as under DDP
                grad = self._averaged(t).view_as(p)
                if self._clip_coef != 1.0:
                    grad.mul_(self._clip_coef)
                saved.append((p, p.grad))
                p.grad = grad
                params.append(p)
        if params:
            self._run_optimizer_on(params)
        for p, g in saved:
            p.grad = g

    def _run_optimizer_on(self, params: list[torch.Tensor]) -> None:
        opt = self.optimizer
        chosen = {id(p) for p in params}
        current = opt.param_groups
        groups = []
        for group, hyper in zip(current, self._hyper, strict=True):
            ps = [p for p in group["params"] if id(p) in chosen]
            if ps:
                groups.append({**hyper, "params": ps})
        opt.param_groups = groups
        try:
            self._orig_step()
        finally:
            opt.param_groups = current

    def flush(self) -> None:
        """Finish all communication and apply every pending update (evaluation, checkpoints)."""
        self._check_error()
        if self._pending:
            self._post("flush", 0)
            self._apply_pending(sorted(self._pending))

    def _optimizer_state_dict(self) -> dict[str, Any]:
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

    # ------------------------------------------------------------ the agent

    def _post(self, kind: str, arg: int) -> None:
        if self.scheduler is not None:  # followers take their orders from rank 0 instead
            self._events.put((kind, arg, self._gen))

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported to the training thread
                if not self._closed:
                    with self._cond:
                        self._error = exc
                        self._cond.notify_all()

        return run

    def _agent_loop(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                if self._leader_decides and self.rank == 0:
                    self._send_decisions([(-1, -1)])
                return
            kind, arg, gen = item
            if kind == "sync":  # the training thread is switching plans and waits for this
                self._synced.set()
                continue
            if kind == "resume":
                if self.scheduler is None:
                    self._follow()  # from now on this rank replays rank 0's decisions
                    return
                continue
            if kind != "comm_done":
                self._agent_gen = gen
            assert self.scheduler is not None
            self._execute(self._dispatch(self.scheduler, kind, arg), self._agent_gen)

    def _dispatch(self, s: Scheduler, kind: str, arg: int) -> Sequence[Launch | Wait]:
        if kind == "grad_ready":
            return s.on_grad_ready(arg)
        if kind == "backward_done":
            return s.on_backward_done()
        if kind == "step":
            return s.on_step()
        if kind == "forward_pre":
            return s.on_forward_pre(arg)
        if kind == "flush":
            return s.on_flush()
        if kind == "comm_done":
            return s.on_comm_done(arg)
        raise AssertionError(kind)

    def _execute(self, actions: Sequence[Launch | Wait], gen: int) -> None:
        decisions = []
        for action in actions:
            if isinstance(action, Launch):
                task_gen = self._gen_for(action.task, gen)
                self._launch(action.task, task_gen)
                decisions.append((action.task, task_gen))
            else:
                self._wait_task(action.task, self._launched[action.task].gen)
        if decisions and self._leader_decides:
            self._send_decisions(decisions)

    def _gen_for(self, task_id: int, gen: int) -> int:
        """An all-gather belongs to the gradients of its reduce-scatter."""
        task = self.plan.tasks[task_id]
        if task.deps:
            return self._launched[task.deps[0]].gen
        return gen

    def _launch(self, task_id: int, gen: int) -> None:
        task = self.plan.tasks[task_id]
        with self._cond:
            while not self._inputs_ready(task, gen):
                self._cond.wait(timeout=self.timeout_s)
                self._raise_if_failed()
        for dep in task.deps:
            self._launched[dep].handle.wait(self.timeout_s)
        slot = self._slots[task_id]
        start = time.perf_counter()
        if task.kind == "all_reduce":
            handle = self._coll.all_reduce(slot.flat)
        elif task.kind == "reduce_scatter":
            assert slot.shard is not None
            handle = self._coll.reduce_scatter(slot.flat, slot.shard)
        else:
            assert slot.shard is not None
            handle = self._coll.all_gather(slot.shard, slot.flat)
        launched = _Launched(handle, gen, start)
        with self._cond:
            self._launched[task_id] = launched
            self._cond.notify_all()
        self._done_q.put((task, launched))

    def _inputs_ready(self, task: Any, gen: int) -> bool:
        if task.kind == "all_gather":
            return all(d in self._launched and self._launched[d].gen == gen for d in task.deps)
        return all(self._ready_gen[t] >= gen for t in task.tensors)

    def _send_decisions(self, decisions: list[tuple[int, int]]) -> None:
        msg = torch.tensor([len(decisions), *itertools.chain.from_iterable(decisions)], dtype=torch.long)
        size = torch.tensor([msg.numel()], dtype=torch.long)
        for r in range(1, self.world):
            dst = dist.get_global_rank(self._ctrl_pg, r)
            dist.send(size, dst=dst, group=self._ctrl_pg)
            dist.send(msg, dst=dst, group=self._ctrl_pg)

    def _follow(self) -> None:
        """Follower: receive and execute rank 0's launches, in rank 0's order, until told to stop."""
        src = dist.get_global_rank(self._ctrl_pg, 0)
        while True:
            size = torch.zeros(1, dtype=torch.long)
            dist.recv(size, src=src, group=self._ctrl_pg)
            msg = torch.zeros(int(size.item()), dtype=torch.long)
            dist.recv(msg, src=src, group=self._ctrl_pg)
            n = int(msg[0])
            for i in range(n):
                task_id, gen = int(msg[1 + 2 * i]), int(msg[2 + 2 * i])
                if task_id < 0:
                    return
                self._launch(task_id, gen)

    def _watch_loop(self) -> None:
        pending: deque[tuple[Any, _Launched]] = deque()
        while True:
            item = self._done_q.get()
            if item is None:
                return
            pending.append(item)
            while pending:
                task, launched = pending.popleft()
                launched.handle.wait(self.timeout_s)
                end = time.perf_counter()
                if self.trace is not None:
                    # From when the transfer began where the handle knows it (ring ops queue behind
                    # each other on one thread), else from the launch, as the simulator's trace counts.
                    start = getattr(launched.handle, "started_s", None) or launched.start_s
                    self.trace.add(
                        TraceEvent(
                            task.name, task.kind, self.rank, start - self._t0, end - self._t0,
                            task.bytes, launched.gen - 1,
                        )
                    )  # fmt: skip
                with self._cond:
                    self._cond.notify_all()
                if self._leader_decides and self.rank == 0:
                    self._events.put(("comm_done", task.id, launched.gen))

    # ------------------------------------------------------------- waiting

    def _wait_task(self, task_id: int, gen: int) -> None:
        """Block the caller until ``task_id`` of gradient generation ``gen`` has finished."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while not (task_id in self._launched and self._launched[task_id].gen >= gen):
                self._raise_if_failed()
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    self._raise_if_failed()
                    raise RuntimeCommError(
                        f"rank {self.rank}: task {self.plan.tasks[task_id].name} of iteration {gen} was not issued "
                        f"within {self.timeout_s:.0f} s; a peer may have crashed or hung"
                    )
            launched = self._launched[task_id]
        try:
            launched.handle.wait(max(1.0, deadline - time.monotonic()))
        except RuntimeCommError:
            raise
        except Exception as exc:
            raise RuntimeCommError(f"rank {self.rank}: {self.plan.tasks[task_id].name} failed: {exc}") from exc

    @contextmanager
    def _peers(self, what: str) -> Iterator[None]:
        """Collectives issued by the training thread: a failing peer becomes a RuntimeCommError."""
        self._check_error()
        try:
            yield
        except RuntimeCommError:
            raise
        except RuntimeError as exc:
            raise RuntimeCommError(f"rank {self.rank}: {what} failed, a peer may have crashed: {exc}") from exc

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            if isinstance(err, RuntimeCommError):
                raise RuntimeCommError(f"rank {self.rank}: communication failed: {err}") from err
            raise RuntimeCommError(f"rank {self.rank}: communication thread failed: {err!r}") from err

    def _check_error(self) -> None:
        with self._cond:
            self._raise_if_failed()

    def close(self) -> None:
        """Stop the threads (idempotent). Pending updates are applied first."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.flush()
        finally:
            self._closed = True
            self._events.put(None)
            self._done_q.put(None)
            self._agent.join(timeout=self.timeout_s)
            self._watcher.join(timeout=self.timeout_s)
            for h in self._handles:
                h.remove()
            self._coll.close()
