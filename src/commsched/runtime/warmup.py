"""Warm-up and planning: measure the live model, make the real plan, check a plan given in.

During warm-up the runtime runs the provisional plan (every gradient
all-reduced after backward, :func:`commsched.schedule.provisional_plan`) and,
in the last warm-up iteration, rank 0 records the order in which layers start
their forward, when each gradient becomes ready, and how long the all-reduce
takes. :func:`measured_workload` turns that into a
:class:`~commsched.workload.Workload` of the live model; rank 0 builds the
policy's :class:`~commsched.schedule.CommPlan` from it and sends it to every
rank as plan JSON — the same path a plan file takes.

A plan given to ``parallelize(plan=...)`` skips all of this; instead the first
iteration records the same orders and :func:`plan_mismatch` compares them with
the plan.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from commsched.formulas import ring_factors
from commsched.layers import LayerSpec, discover_layers
from commsched.profile.network import PS_OP, ps_task_cpu
from commsched.profile.probe_fit import ProbeSample, fit_cpu
from commsched.schedule import CommPlan, NetworkEstimate
from commsched.schedule.base import PS_TRANSPORT
from commsched.schedule.fusion import ready_order
from commsched.transport.base import TransportOptions
from commsched.workload import Layer, Provenance, Tensor, Workload

#: Iterations ``parallelize`` runs the provisional plan before it plans (``warmup_iters``'s default).
WARMUP_ITERS = 2

DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64"}


class Recorder:
    """Forward call order and times, gradient-ready times, all-reduce seconds of one iteration."""

    __slots__ = (
        "active",
        "allreduce_cpu_s",
        "allreduce_messages",
        "allreduce_s",
        "called",
        "forward_end_s",
        "forward_s",
        "latency_cpu_s",
        "latency_s",
        "ready_s",
        "transport_samples",
    )

    def __init__(self) -> None:
        self.active = False
        self.called: dict[int, int] = {}  # id(module) -> rank of its first call
        self.forward_s: dict[int, float] = {}  # id(module) -> time of its first call
        self.forward_end_s: float | None = None  # when the wrapper's forward returned
        self.ready_s: dict[int, float] = {}  # id(param) -> time its gradient was ready
        self.allreduce_s: list[float] = []  # the warm-up's all-reduces of every gradient after backward
        self.allreduce_cpu_s: list[float] = []  # this process's CPU time (every thread) during each of them
        self.allreduce_messages = 1  # messages each of them takes (the provisional plan's tasks)
        self.latency_s: list[float] = []  # all-reduces of one element: the per-message cost
        self.latency_cpu_s: list[float] = []  # and the CPU time each took
        self.transport_samples: tuple[ProbeSample, ...] = ()  # a transport timed apart (time_transports)

    def forward_pre(self, module: nn.Module) -> None:
        if self.active and id(module) not in self.called:
            self.called[id(module)] = len(self.called)
            self.forward_s[id(module)] = time.perf_counter()

    def forward_ends(self) -> None:
        if self.active and self.forward_end_s is None:
            self.forward_end_s = time.perf_counter()

    def grad_ready(self, param: nn.Parameter) -> None:
        if self.active:
            self.ready_s[id(param)] = time.perf_counter()


def measured_workload(model: nn.Module, rec: Recorder) -> tuple[Workload, list[LayerSpec]]:
    """The live model as a Workload: layers in recorded forward order with measured times.

    A layer's forward runs from its start to the next layer's, the last one's to the end of the wrapper's
    forward; gradient-ready times count from there, so the loss and the backward before the first gradient
    (a tied output projection's, whose gradient goes to the embedding: ready last) are compute the plan sees,
    with no gradient to send. (Counted from the first gradient, as they once were, they were left out:
    for ``gpt5m`` on the testbed the output layer's forward (24 ms) and the backward before the first
    gradient (51 ms), 75 ms of a 199 ms iteration in the profile, went missing, and ``auto`` predicted its
    plans at 596-609 ms where the simulator's bound for the model's order is 674: BENCHMARKS.md, "A
    transformer with today's ``auto``".)
    """
    specs = discover_layers(model, rec.called)
    starts = [rec.forward_s.get(id(spec.module)) for spec in specs]
    first_ready = min(rec.ready_s.values(), default=0.0)
    end = rec.forward_end_s
    from_end = end is not None and end <= first_ready
    ready0 = end if from_end and end is not None else first_ready
    last_ms = (max(rec.ready_s.values(), default=0.0) - ready0) * 1e3
    layers = []
    for i, spec in enumerate(specs):
        forward_ms = 0.0
        until = starts[i + 1] if i + 1 < len(specs) else (end if from_end else None)
        if starts[i] is not None and until is not None:
            forward_ms = max(0.0, (until - starts[i]) * 1e3)  # type: ignore[operator]
        tensors, ready = [], []
        for pname, p in spec.params:
            tensors.append(Tensor(name=pname, numel=p.numel(), dtype=dtype_name(p), shape=tuple(p.shape)))
            # A gradient that never came is reported at the end of backward.
            ready.append((rec.ready_s[id(p)] - ready0) * 1e3 if id(p) in rec.ready_s else last_ms)
        layers.append(
            Layer(
                name=spec.name,
                tensors=tuple(tensors),
                forward_ms=forward_ms,
                backward_ms=0.0,
                grad_ready_ms=tuple(ready) if rec.ready_s else None,
            )
        )
    return live_workload(model, layers), specs


def unmeasured_workload(model: nn.Module) -> Workload:
    """The live model before anything ran: each parameter holder a layer, registration order, no times."""
    layers = [
        Layer(
            name=spec.name,
            tensors=tuple(
                Tensor(name=n, numel=p.numel(), dtype=dtype_name(p), shape=tuple(p.shape)) for n, p in spec.params
            ),
            forward_ms=0.0,
            backward_ms=0.0,
        )
        for spec in discover_layers(model)
    ]
    return live_workload(model, layers)


def live_workload(model: nn.Module, layers: Sequence[Layer]) -> Workload:
    device = next((str(p.device) for p in model.parameters()), "cpu")
    return Workload(
        model=type(model).__name__,
        batch_size=1,
        device=device,
        layers=tuple(layers),
        provenance=Provenance(kind="measured", source="commsched.runtime warm-up"),
    )


def dtype_name(p: nn.Parameter) -> str:
    return DTYPE_NAMES.get(str(p.dtype), "fp32")


def measured_network(world: int, gradient_bytes: int, rec: Recorder) -> NetworkEstimate | None:
    """α from the tiny all-reduces (``T₀ / 2(p-1)``), then β from the fastest warm-up all-reduce of every
    gradient: ``B = 2(p-1)/p · n / (T - 2(p-1)·α)`` (the ring formula solved for B).

    The CPU cost of communication the same way: per message the median CPU time of a tiny all-reduce
    ``c₀``; per byte ``(C - m·c₀) / n`` from the least CPU time ``C`` of the warm-up's all-reduces of
    ``n`` bytes in ``m`` messages (kept >= 0). CPU time is this process's, every thread
    (``time.process_time``): the collective's threads and the kernel's work on their behalf.
    The ``"ps"`` transport's, where :func:`time_transports` timed it: the line through its push-and-pull
    pairs' CPU times (:func:`~commsched.profile.probe_fit.fit_cpu`), half of it per task.
    """
    if world < 2 or not rec.allreduce_s:
        return None
    steps, volume = ring_factors("all_reduce", world)
    alpha_s = min(rec.latency_s) / steps if rec.latency_s else 0.0
    transfer_s = max(min(rec.allreduce_s) - steps * alpha_s, 1e-9)
    cpu_message_s = statistics.median(rec.latency_cpu_s) if rec.latency_cpu_s else 0.0
    cpu_byte_s = 0.0
    if rec.allreduce_cpu_s and gradient_bytes > 0:
        cpu_byte_s = max(0.0, min(rec.allreduce_cpu_s) - rec.allreduce_messages * cpu_message_s) / gradient_bytes
    transport_cpu: tuple[tuple[str, float, float], ...] = ()
    pair = fit_cpu(rec.transport_samples, PS_OP)
    if pair is not None:
        task = ps_task_cpu(pair)
        transport_cpu = ((PS_TRANSPORT, task.per_op_s, task.per_byte_s),)
    return NetworkEstimate(
        world, volume * gradient_bytes / transfer_s, alpha_s, cpu_message_s, cpu_byte_s, transport_cpu
    )


#: What :func:`time_transports` times the ``"ps"`` transport with: a fused small task's size and a
#: partition's; each a push and its pull, once to warm up and 3 times measured (about 0.1 s at
#: 300 Mbit/s between 2 ranks).
PS_TIMING_SIZES_BYTES = (64 * 1024, 2 * 1024 * 1024)
PS_TIMING_REPEATS = 3


def time_transports(
    group: dist.ProcessGroup, transports: frozenset[str], options: TransportOptions | None
) -> tuple[ProbeSample, ...]:
    """Samples of the transports among ``transports`` whose CPU work is measured apart (the ``"ps"``
    transport: push-and-pull pairs as the network probe times them, on a transport opened and closed
    for it, listening where ``options`` say). Collective: every rank of ``group``, the same
    ``transports``."""
    if PS_TRANSPORT not in transports:
        return ()
    from commsched.profile.network import measure_ops

    return measure_ops(group, PS_TIMING_SIZES_BYTES, PS_TIMING_REPEATS, 1, (PS_OP,), transport_options=options)


def first_iteration_mismatch(
    plan: CommPlan, rec: Recorder, layer_modules: Sequence[nn.Module], params: Sequence[torch.Tensor]
) -> str | None:
    """:func:`plan_mismatch` of what ``rec`` recorded in the first iteration under ``plan``."""
    names = {id(m): layer.name for m, layer in zip(layer_modules, plan.workload.layers, strict=True)}
    layer_order = [names[m] for m in sorted(rec.called, key=rec.called.__getitem__) if m in names]
    got = [t for t, p in enumerate(params) if id(p) in rec.ready_s]
    ready = sorted(got, key=lambda t: rec.ready_s[id(params[t])])
    return plan_mismatch(plan, layer_order, ready)


def plan_mismatch(plan: CommPlan, layer_order: Sequence[str], ready_tensors: Sequence[int]) -> str | None:
    """Why the first iteration does not match ``plan`` (None when it does).

    ``layer_order``: names of the plan's layers in the order their forward
    started; ``ready_tensors``: plan tensors in the order their gradients became
    ready (those without a gradient left out). The plan's gradient-ready times
    may tie; tensors with equal times may come in any order.
    """
    expected = [layer.name for layer in plan.workload.layers]
    seen = [name for name in layer_order if name in set(expected)]
    planned = [name for name in expected if name in set(seen)]
    for pos, (a, b) in enumerate(zip(planned, seen, strict=True)):
        if a != b:
            return f"forward order: the plan runs layer {a!r} at position {pos}, the model ran {b!r}"
    times = plan.workload.grad_ready_ms
    rank = {t: pos for pos, t in enumerate(ready_order(plan.workload))}
    for first, then in itertools.pairwise(ready_tensors):
        if rank[first] > rank[then] and times[first] != times[then]:
            names = plan.workload.tensors
            return (
                f"gradient-ready order: the plan expects {names[then].name!r} before {names[first].name!r}, "
                "the model produced them the other way round"
            )
    return None
