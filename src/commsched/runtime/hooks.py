"""Hooks: the training thread's forward and backward, turned into the engine's events.

* a forward pre-hook on every module with parameters below it (a layer's
  forward starts: its deferred update may be due);
* a post-accumulate-grad hook on every trainable parameter (its gradient is
  final for this backward);
* a ``state_dict`` pre-hook (whoever reads the weights sees them updated).

:class:`ComputeTracer` turns the same hooks into the compute intervals of a
measured trace (forward per layer; backward per layer, ending at the layer's
last gradient), in the simulator's trace schema.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from commsched.trace import Trace, TraceEvent


def install_hooks(
    model: nn.Module,
    params: list[nn.Parameter],
    on_forward_pre: Callable[[nn.Module], None],
    on_grad: Callable[[nn.Parameter], None],
    on_state_dict: Callable[[], None],
) -> list[Any]:
    """Register the runtime's hooks; returns their handles (``h.remove()`` undoes them)."""
    handles: list[Any] = []
    for mod in model.modules():
        if any(True for _ in mod.parameters()):
            handles.append(mod.register_forward_pre_hook(lambda m, _args: on_forward_pre(m)))
    for p in params:
        handles.append(p.register_post_accumulate_grad_hook(on_grad))
    handles.append(model.register_state_dict_pre_hook(lambda *_a, **_k: on_state_dict()))
    return handles


class ComputeTracer:
    """Compute intervals of the training thread as trace events (``forward``/``backward`` per layer)."""

    __slots__ = ("_open", "_t0", "rank", "trace")

    def __init__(self, trace: Trace, rank: int, t0: float) -> None:
        self.trace = trace
        self.rank = rank
        self._t0 = t0
        self._open: list[Any] | None = None  # [kind, layer name or None, start, end or None]

    def forward_starts(self, layer: str, iteration: int) -> None:
        self._mark("forward", layer, time.perf_counter(), True, iteration)

    def gradient_ready(self, layer: str, iteration: int) -> None:
        """The backward interval that ends at a layer's last gradient is that layer's."""
        self._mark("backward", layer, time.perf_counter(), False, iteration)

    def forward_ends(self, iteration: int) -> None:
        """After the model's forward: backward (and the loss) start here."""
        if self._open is not None and self._open[0] == "forward":
            end = self._close(time.perf_counter(), iteration)
            self._open = ["backward", None, end, end]

    def backward_ends(self, iteration: int) -> None:
        self._close(time.perf_counter(), iteration)

    def _mark(self, kind: str, layer: str, now: float, starts: bool, iteration: int) -> None:
        open_ = self._open
        if open_ is not None and open_[0] == kind and open_[1] == layer:
            if not starts:
                open_[3] = now
            return
        start = self._close(now if starts or open_ is None else open_[3], iteration)
        self._open = [kind, layer, now, None] if starts else [kind, layer, start, now]

    def _close(self, now: float, iteration: int) -> float:
        """Record the open interval (ending at ``now`` unless it has its own end); return where it ended."""
        open_, self._open = self._open, None
        if open_ is None:
            return now
        kind, layer, start, end = open_
        end = now if end is None else end
        if layer is not None:  # None: only a mark of where the next interval starts
            self.trace.add(TraceEvent(layer, kind, self.rank, start - self._t0, end - self._t0, 0, iteration))
        return end


def grad_enabled_training(model: nn.Module) -> bool:
    return torch.is_grad_enabled() and model.training
