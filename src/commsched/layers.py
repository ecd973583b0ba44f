"""What a "layer" of a live model is, decided in one place for the profiler and the runtime.

A layer is a module whose forward is *called* (its forward pre-hook fires),
together with the trainable parameters it owns: those it holds directly and
those of descendants that are never called themselves (e.g.
``MultiheadAttention.out_proj``, whose weights its parent uses without
calling it). A parameter held by several modules (tied weights) belongs to the
layer that runs first. Parameters of modules that never ran belong to the
root. Layers are in first-call (forward) order.

Without a call order (``called=None``: before anything ran), every module
that holds trainable parameters directly is a layer, in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its name (the module's qualified name; the model's class name for the root)."""

    name: str
    module: nn.Module
    params: tuple[tuple[str, nn.Parameter], ...]


def call_order(model: nn.Module, run: Callable[[], object]) -> dict[int, int]:
    """``id(module) -> rank of its first forward call`` over one run of ``run``."""
    order: dict[int, int] = {}

    def pre_hook(module: nn.Module, args: Any) -> None:
        order.setdefault(id(module), len(order))

    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules()]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return order


def discover_layers(model: nn.Module, called: dict[int, int] | None = None) -> list[LayerSpec]:
    """The model's layers (see the module docstring); ``called`` from :func:`call_order`."""
    modules = dict(model.named_modules())
    name_of = {id(m): name for name, m in modules.items()}
    if called is None:  # registration order, each holder its own layer
        called = {}
        for m in modules.values():
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                called.setdefault(id(m), len(called))
    root_rank = called.get(id(model), -1)

    def anchor(module: nn.Module) -> nn.Module:
        name = name_of[id(module)]
        while id(module) not in called and name:
            name = name.rpartition(".")[0]
            module = modules[name]
        return module if id(module) in called else model

    def rank(module: nn.Module) -> int:
        return called.get(id(module), root_rank)

    holders: dict[int, list[nn.Module]] = {}
    for m in modules.values():
        for p in m.parameters(recurse=False):
            if p.requires_grad:
                holders.setdefault(id(p), []).append(m)
    anchors: dict[int, nn.Module] = {}
    for hs in holders.values():
        for h in hs:
            a = anchor(h)
            anchors[id(a)] = a
    owned: dict[int, list[tuple[str, nn.Parameter]]] = {key: [] for key in anchors}
    for pname, p in model.named_parameters():
        if p.requires_grad:
            first = min((anchor(h) for h in holders[id(p)]), key=rank)
            owned[id(first)].append((pname, p))
    ordered = sorted(anchors.values(), key=rank)
    return [LayerSpec(layer_name(model, m, name_of[id(m)]), m, tuple(owned[id(m)])) for m in ordered]


def layer_name(model: nn.Module, module: nn.Module, qualified: str) -> str:
    """A layer's name: its qualified module name, or the model's class name for the root."""
    return qualified or type(model).__name__


def layer_module(model: nn.Module, name: str) -> nn.Module:
    """The module of a layer named by :func:`layer_name`; KeyError if the model has none by that name."""
    if name == type(model).__name__ and not any(n == name for n, _ in model.named_modules()):
        return model
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise KeyError(name) from None
