"""Record one profiled iteration layer by layer: the hooks, their marks, and the per-layer times they give.

:func:`~commsched.profile.compute.profile_model` runs a :class:`_Profiler`
once to find the layers, then once per repeat with its hooks in place. What
the hooks measure:

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
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from commsched.layers import LayerSpec, call_order, discover_layers
from commsched.profile.clocks import _Clock

Batch = tuple[Any, Any]
"""``(inputs, target)``: ``inputs`` a tensor or a tuple of positional arguments."""


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
