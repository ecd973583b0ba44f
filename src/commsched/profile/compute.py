"""Per-layer compute profile of a real model: forward, backward and gradient-ready times.

>>> workload = profile_model(model, lambda: (x, y), F.cross_entropy, batch_size=32, model_name="resnet18")
>>> iteration_check(workload).ratio  # sum of layer times / a separately measured iteration

What is measured, per iteration (``warmup`` untimed first, then the median of
``repeats``):

Layers
    The modules that own trainable parameters directly, in the order their
    forward first runs (recorded, never the registration order). A module whose
    forward never runs while its parameters are used by an ancestor (e.g.
    ``MultiheadAttention.out_proj``, read by the attention's own forward) joins
    the nearest ancestor that runs: the ancestor is the layer and holds the
    tensors. A tied parameter appears once, in the first layer that runs it; a
    later module holding it stays a layer without tensors of its own (for its
    compute time). Tensors are named, shaped and ordered as in
    ``named_parameters()``; parameters with ``requires_grad=False`` are left
    out (nothing to communicate).
Forward time
    Forward pre- and post-hooks on every layer cut the forward (up to the loss,
    included) into segments; a segment is charged to the layer whose hook opened
    it. So a layer is charged its own work plus the parameter-free work that
    follows it (activations, pooling, residual adds, the loss after the last
    layer), the zoo's convention, and the layer times add up to the forward.
Gradient-ready time
    ``register_post_accumulate_grad_hook`` on every parameter: the moment its
    ``.grad`` is final, as ms from the start of ``backward()``. A parameter that
    gets no gradient is ready when backward ends.
Backward time
    The mirror of the forward: layer ``l``'s backward is the time between the
    previous layer (in backward order, i.e. reverse forward order) becoming
    ready and layer ``l``'s last gradient being ready; the rest of backward after
    the last gradient goes to the first layer. This is exactly how the simulator
    lays out a workload's backward, and the times add up to the backward. A layer
    without gradients of its own (a tied output projection) ends when the next
    layer's backward starts, seen by a pre-hook on the autograd node of that
    layer's output.
Whole iteration
    Separately, the same forward + backward without any hook, interleaved with
    the profiled iterations: ``extra["iteration_ms"]``. :func:`iteration_check`
    compares it with the sum of the layer times.

Why these hooks: module *backward* hooks (``register_full_backward_hook``) wrap
the module's inputs and outputs in a custom autograd function, and an in-place
op on such an output (torchvision's ``ReLU(inplace=True)`` after a BatchNorm,
``out += identity``) raises. Forward hooks, post-accumulate-grad hooks and
pre-hooks on autograd nodes wrap nothing, so in-place code runs unchanged.

Why the ready order can be trusted: PyTorch's autograd engine runs the ready
node with the highest sequence number (creation order in forward) first, and
``AccumulateGrad`` nodes before any other, so when every parameter is used once
and layers do not nest, every gradient of a later layer is final before any
gradient of an earlier one. A tied or reused parameter is final only after its
last use's backward.

Clocks: ``time.perf_counter`` on CPU. On CUDA, CUDA events recorded on the
current stream by the same hooks (autograd runs backward nodes and their hooks
with the forward op's stream current), resolved after a synchronize, so the
times are GPU execution times, not launch times. (The CUDA path is written to
that design but has not run here: the machine this was written on has no GPU.)
bf16 runs the forward and the loss under ``torch.autocast``; parameters and
gradients keep their dtype (fp32), which is what the tensors record.

The model's parameters, gradients, buffers (BatchNorm statistics) and the RNG
are left as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from commsched.errors import SpecError, UnsupportedError
from commsched.layers import LayerSpec, call_order, discover_layers
from commsched.workload import Layer, Provenance, Tensor, Workload

__all__ = [
    "IterationCheck",
    "device_names",
    "iteration_check",
    "profile_model",
    "zoo_filename",
]

_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
_PARAM_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}

Batch = tuple[Any, Any]
"""``(inputs, target)``: ``inputs`` a tensor or a tuple of positional arguments."""


# ---------------------------------------------------------------- clocks


class _Clock(Protocol):
    def mark(self) -> Any:
        """A point in time (on the device's stream for CUDA)."""
        ...

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds from ``start`` to ``end`` (valid after :meth:`sync`)."""
        ...

    def sync(self) -> None: ...


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def sync(self) -> None:
        pass


class _CudaClock:
    """CUDA events recorded on the current stream of the calling thread."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end))

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


# ---------------------------------------------------------------- layers


# ---------------------------------------------------------------- one iteration


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors inside a (nested) tuple, list, dict or tensor."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors_in(v)


def _default_loss(output: Any, target: Any) -> torch.Tensor:
    """Mean of every floating tensor of the output (the target is ignored)."""
    terms = [t.float().mean() for t in _tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise SpecError("profile", ["model output: no floating-point tensor that requires grad to take a loss of"])
    return torch.stack(terms).sum()


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_to_device(v, device) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


@dataclass
class _Record:
    """Marks taken by the hooks during one profiled iteration."""

    forward: list[tuple[Any, int]] = dataclasses.field(default_factory=list)  # (mark, layer) per pre/post hook
    starts: dict[int, Any] = dataclasses.field(default_factory=dict)  # layer -> its first backward start
    ready: dict[int, Any] = dataclasses.field(default_factory=dict)  # tensor -> when its grad was final


@dataclass(frozen=True)
class _Sample:
    """One profiled iteration, in ms: from forward start (forward) or from backward start (the rest)."""

    forward_ms: list[float]  # per layer
    forward_total_ms: float
    ready_ms: list[float | None]  # per tensor; None: no gradient
    starts_ms: dict[int, float]  # layer -> when the gradient of its output arrived
    backward_total_ms: float


def _backward_partition(
    ready_ms: Sequence[float | None],
    starts_ms: dict[int, float],
    total_ms: float,
    tensor_layer: Sequence[int],
    num_layers: int,
) -> list[float]:
    """Per layer: from the previous layer (reverse forward order) being ready to its own last gradient.

    A layer without gradients ends when an earlier layer's backward starts;
    the rest of backward goes to the first layer (see the module docstring).
    """
    ends: list[float | None] = [None] * num_layers
    for t, li in zip(ready_ms, tensor_layer, strict=True):
        if t is not None:
            prev = ends[li]
            ends[li] = t if prev is None else max(prev, t)
    for li in range(num_layers):
        if ends[li] is None and li in starts_ms:
            later = [s for k, s in starts_ms.items() if k < li and s > starts_ms[li]]
            ends[li] = min(later) if later else None
    backward = [0.0] * num_layers
    cursor = 0.0
    for li in range(num_layers - 1, -1, -1):
        end = ends[li]
        if end is not None and end > cursor:
            backward[li] = end - cursor
            cursor = end
    backward[0] += max(0.0, total_ms - cursor)
    return backward


class _Profiler:
    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        clock: _Clock,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self.model = model
        inputs, self.target = batch
        self.inputs: tuple[Any, ...] = inputs if isinstance(inputs, tuple) else (inputs,)
        self.loss_fn = loss_fn
        self.clock = clock
        self.autocast = autocast
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]
        self.layers: list[LayerSpec] = []
        self.order: list[int] = []  # per tensor (workload order): its index in self.params
        self.tensor_layer: list[int] = []  # per tensor: its layer
        self.rec = _Record()

    def run(self) -> tuple[Any, Any, Any]:
        """One forward + loss + backward; marks at its start, at backward start and at its end."""
        for p in self.params:
            p.grad = None
        clock = self.clock
        clock.sync()
        t0 = clock.mark()
        with self.autocast():
            loss = self.loss_fn(self.model(*self.inputs), self.target)
        t1 = clock.mark()
        loss.backward()
        t2 = clock.mark()
        clock.sync()
        return t0, t1, t2

    def discover(self) -> None:
        called = call_order(self.model, self.run)
        self.layers = discover_layers(self.model, called)
        index = {id(p): i for i, p in enumerate(self.params)}
        self.order = [index[id(p)] for spec in self.layers for _, p in spec.params]
        self.tensor_layer = [li for li, spec in enumerate(self.layers) for _ in spec.params]

    # ---- hooks ----

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        rec, clock = self.rec, self.clock
        handles: list[Any] = []

        def on_start(li: int) -> Callable[..., None]:
            def hook(grad_outputs: Any) -> None:
                if li not in rec.starts:
                    rec.starts[li] = clock.mark()

            return hook

        def pre(li: int) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                rec.forward.append((clock.mark(), li))

            return hook

        def post(li: int) -> Callable[..., None]:
            start = on_start(li)

            def hook(module: nn.Module, args: Any, output: Any) -> None:
                rec.forward.append((clock.mark(), li))
                if torch.is_grad_enabled():
                    nodes = {id(t.grad_fn): t.grad_fn for t in _tensors_in(output) if t.grad_fn is not None}
                    for node in nodes.values():
                        node.register_prehook(start)

            return hook

        def ready(ti: int) -> Callable[[torch.Tensor], None]:
            def hook(param: torch.Tensor) -> None:
                if ti not in rec.ready:
                    rec.ready[ti] = clock.mark()

            return hook

        try:
            for li, spec in enumerate(self.layers):
                handles.append(spec.module.register_forward_pre_hook(pre(li)))
                handles.append(spec.module.register_forward_hook(post(li), always_call=True))
            for ti, pi in enumerate(self.order):
                handles.append(self.params[pi].register_post_accumulate_grad_hook(ready(ti)))
            yield
        finally:
            for h in handles:
                h.remove()

    def profiled(self) -> _Sample:
        rec = self.rec  # the hooks write into it
        rec.forward.clear()
        rec.starts.clear()
        rec.ready.clear()
        t0, t1, t2 = self.run()
        ms = self.clock.ms
        forward = [0.0] * len(self.layers)
        total_f = ms(t0, t1)
        # (a forward hook firing during backward, e.g. activation checkpointing's recomputation, is backward time)
        marks = [(at, li) for m, li in rec.forward if (at := ms(t0, m)) <= total_f]
        current, last = (marks[0][1] if marks else 0), 0.0
        for at, li in marks:
            forward[current] += max(0.0, at - last)
            current, last = li, max(last, at)
        forward[current] += max(0.0, total_f - last)
        ready = [ms(t1, rec.ready[ti]) if ti in rec.ready else None for ti in range(len(self.order))]
        starts = {li: ms(t1, m) for li, m in rec.starts.items()}
        return _Sample(forward, total_f, ready, starts, ms(t1, t2))

    def plain(self) -> float:
        t0, _, t2 = self.run()
        return self.clock.ms(t0, t2)


@contextlib.contextmanager
def _preserved(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Restore gradients, buffers and the RNG state after profiling."""
    grads = {id(p): p.grad for p in model.parameters()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for p in model.parameters():
            p.grad = grads[id(p)]
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


# ---------------------------------------------------------------- device names


def device_names(device: str | torch.device = "cpu") -> tuple[str, str]:
    """``(short, full)`` name of a device: ``("H100", "NVIDIA H100 80GB HBM3")``, ``("cpu", "AMD EPYC ...")``.

    The short name is what a profile is filed under (``resnet50.H100.json``).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        full = torch.cuda.get_device_name(dev)
        match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", full)
        short = match.group(1) if match else re.sub(r"[^A-Za-z0-9_-]+", "-", full).strip("-")
        return short, full
    full = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                full = line.split(":", 1)[1].strip()
                break
    return "cpu", full or platform.processor() or platform.machine() or "cpu"


def zoo_filename(workload: Workload) -> str:
    """The file name the zoo would ship this profile under: ``MODEL.DEVICE[.DTYPE].json``."""
    suffix = "" if workload.dtype == "fp32" else f".{workload.dtype}"
    return f"{workload.model}.{workload.device}{suffix}.json"


# ---------------------------------------------------------------- the public function


def profile_model(
    model: nn.Module,
    make_batch: Callable[[], Batch],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    *,
    batch_size: int,
    model_name: str,
    device: str | torch.device = "cpu",
    dtype: str = "fp32",
    warmup: int = 3,
    repeats: int = 10,
    command: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Workload:
    """Measure one training iteration of ``model`` layer by layer (see the module docstring).

    ``make_batch()`` returns ``(inputs, target)``; it is called once and the
    batch is reused (data loading is not part of the profile). ``inputs`` is a
    tensor or a tuple of positional arguments, moved to ``device``.
    ``loss_fn(output, target)`` defaults to the mean of the output. The model
    must already be on ``device``; it runs in the mode it is in (``train()``
    for a training profile). ``batch_size`` and ``model_name`` are recorded in
    the Workload (the zoo names profiles ``MODEL.DEVICE[.DTYPE]``), ``command``
    in its provenance. ``progress(done, total)`` is called after each
    iteration.

    One untimed forward + backward first records the forward order; then
    ``warmup`` untimed iterations, then ``repeats`` timed ones, each a profiled
    iteration (hooks) and a plain one (no hooks). Every time is the median over
    the repeats. ``extra`` records ``iteration_ms`` (plain),
    ``profiled_iteration_ms`` (with hooks), ``warmup``, ``repeats``, ``threads``.

    Raises SpecError for a bad argument, UnsupportedError for a device or dtype
    this cannot time.
    """
    problems = []
    if dtype not in _DTYPES:
        problems.append(f"dtype: must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if warmup < 0:
        problems.append(f"warmup: must be >= 0, got {warmup}")
    if repeats < 1:
        problems.append(f"repeats: must be >= 1, got {repeats}")
    if batch_size < 1:
        problems.append(f"batch_size: must be >= 1, got {batch_size}")
    if not model_name:
        problems.append("model_name: must not be empty")
    if problems:
        raise SpecError("profile", problems)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UnsupportedError("profile: device 'cuda' requested but torch.cuda.is_available() is False")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        clock: _Clock = _CudaClock(dev)
    elif dev.type == "cpu":
        clock = _CpuClock()
    else:
        raise UnsupportedError(f"profile: device must be cpu or cuda, got {str(device)!r}")
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise SpecError("profile", ["model: has no trainable parameters"])
    wrong = [n for n, p in params if p.device != dev]
    if wrong:
        where = f"model: parameter {wrong[0]!r} is not on {dev}; call model.to({str(dev)!r}) first"
        raise SpecError("profile", [where])

    amp = _DTYPES[dtype]

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=dev.type, dtype=amp)

    total = 1 + warmup + repeats
    with _preserved(model, dev):
        inputs, target = make_batch()
        batch = (_to_device(inputs, dev), _to_device(target, dev))
        prof = _Profiler(model, batch, loss_fn or _default_loss, clock, autocast)
        prof.discover()
        if progress:
            progress(1, total)
        samples: list[_Sample] = []
        plain: list[float] = []
        for i in range(warmup + repeats):
            # alternate, so drift (thermal, other load) affects both alike
            with prof.hooks():
                sample = prof.profiled()
            iteration = prof.plain()
            if i >= warmup:
                samples.append(sample)
                plain.append(iteration)
            if progress:
                progress(2 + i, total)
        for p in prof.params:
            p.grad = None

    def med(values: Sequence[float]) -> float:
        return float(statistics.median(values))

    # Medians per tensor keep the ready order of every repeat (a_i <= b_i for all i implies
    # median(a) <= median(b)); the backward is partitioned once, on the medians, so the
    # layer times agree with the ready times exactly.
    total_b = med([s.backward_total_ms for s in samples])
    got = [all(s.ready_ms[ti] is not None for s in samples) for ti in range(len(prof.order))]
    ready_ms = [
        med([r if (r := s.ready_ms[ti]) is not None else s.backward_total_ms for s in samples])
        for ti in range(len(prof.order))
    ]
    seen = [li for li in range(len(prof.layers)) if all(li in s.starts_ms for s in samples)]
    starts_ms = {li: med([s.starts_ms[li] for s in samples]) for li in seen}
    backward = _backward_partition(
        [r if ok else None for r, ok in zip(ready_ms, got, strict=True)],
        starts_ms,
        total_b,
        prof.tensor_layer,
        len(prof.layers),
    )
    layers = []
    ti = 0
    for li, spec in enumerate(prof.layers):
        tensors = []
        for pname, p in spec.params:
            tensors.append(
                Tensor(name=pname, numel=p.numel(), dtype=_PARAM_DTYPES.get(p.dtype, "fp32"), shape=tuple(p.shape))
            )
        n = len(tensors)
        layers.append(
            Layer(
                name=spec.name,
                tensors=tuple(tensors),
                forward_ms=med([s.forward_ms[li] for s in samples]),
                backward_ms=backward[li],
                grad_ready_ms=tuple(ready_ms[ti : ti + n]),
            )
        )
        ti += n
    short, full = device_names(dev)
    threads = torch.get_num_threads()
    timer = "CUDA events" if dev.type == "cuda" else "time.perf_counter"
    missing = got.count(False)
    notes = f"{missing} parameter tensor(s) got no gradient (ready at the end of backward)" if missing else ""
    return Workload(
        model=model_name,
        batch_size=batch_size,
        device=short,
        dtype=dtype,
        layers=tuple(layers),
        provenance=Provenance(
            kind="measured",
            source=full if dev.type == "cuda" else f"{full}, {threads} intra-op thread(s)",
            method=(
                f"commsched.profile: forward pre/post hooks, post-accumulate-grad hooks, {timer}; "
                f"median of {repeats} after {warmup} warm-up"
                + (f"; torch.autocast({dtype})" if amp is not None else "")
            ),
            torch_version=torch.__version__,
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            command=command,
            notes=notes,
        ),
        extra={
            "iteration_ms": med(plain),
            "profiled_iteration_ms": med([s.forward_total_ms + s.backward_total_ms for s in samples]),
            "warmup": warmup,
            "repeats": repeats,
            "threads": threads,
        },
    )


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class IterationCheck:
    """The sum of a profile's layer times against a whole iteration measured without hooks.

    ``layer_sum_ms``: sum of every layer's forward and backward (medians).
    ``profiled_iteration_ms``: median forward + backward of the hooked iterations
    (the layer times partition each of them, so this differs from
    ``layer_sum_ms`` only by taking medians per layer). ``iteration_ms``: median
    of the plain iterations. ``ratio = layer_sum_ms / iteration_ms``: above 1 by
    the hooks' own cost (a few µs per layer and per tensor, which matters only
    for tiny layers) and by noise.
    """

    layer_sum_ms: float
    profiled_iteration_ms: float
    iteration_ms: float

    @property
    def ratio(self) -> float:
        return self.layer_sum_ms / self.iteration_ms if self.iteration_ms > 0 else math.inf

    def ok(self, tolerance: float = 0.2) -> bool:
        """``|ratio - 1| <= tolerance``."""
        return abs(self.ratio - 1.0) <= tolerance


def iteration_check(workload: Workload) -> IterationCheck:
    """The check of a profile written by :func:`profile_model` (SpecError if it has no ``iteration_ms``)."""
    extra = workload.extra
    plain = extra.get("iteration_ms")
    if not isinstance(plain, int | float):
        raise SpecError(workload.model, ["extra.iteration_ms: is required (written by commsched.profile)"])
    hooked = extra.get("profiled_iteration_ms")
    layer_sum = workload.forward_ms + workload.backward_ms
    return IterationCheck(
        layer_sum_ms=layer_sum,
        profiled_iteration_ms=float(hooked) if isinstance(hooked, int | float) else layer_sum,
        iteration_ms=float(plain),
    )
