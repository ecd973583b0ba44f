"""Per-layer compute profile of a real model: forward, backward and gradient-ready times.

>>> workload = profile_model(model, lambda: (x, y), F.cross_entropy, batch_size=32, model_name="resnet18")
>>> iteration_check(workload).ratio  # sum of layer times / a separately measured iteration

What is measured, per iteration (``warmup`` untimed first, then the median of
``repeats``): the layers and their forward, backward and gradient-ready times,
taken by hooks as :mod:`commsched.profile.recorder` describes, on the clocks
of :mod:`commsched.profile.clocks`; and the whole iteration below.

Whole iteration
    Separately, the same forward + backward without any hook, interleaved with
    the profiled iterations: ``extra["iteration_ms"]``. :func:`iteration_check`
    (:mod:`commsched.profile.check`) compares it with the sum of the layer times.

bf16 runs the forward and the loss under ``torch.autocast``; parameters and
gradients keep their dtype (fp32), which is what the tensors record.

The model's parameters, gradients, buffers (BatchNorm statistics) and the RNG
are left as they were.
"""

from __future__ import annotations

import contextlib
import datetime
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from commsched.errors import SpecError, UnsupportedError
from commsched.profile.clocks import _Clock, _CpuClock, _CudaClock
from commsched.profile.names import device_names
from commsched.profile.recorder import Batch, _backward_partition, _Profiler, _Sample, _tensors_in
from commsched.workload import Layer, Provenance, Tensor, Workload

__all__ = ["profile_model"]

_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
_PARAM_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


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
