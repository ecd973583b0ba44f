"""A plan bound to a live model: which parameter is each plan tensor, which module each plan layer.

A plan names tensors and layers (parameter and module names), so one made
elsewhere — by the simulator from a profile, by a planner, by rank 0 after
warm-up — runs on any replica of the model it was made for. Binding checks
that it fits: the world size it was made for, every trainable parameter and
no other, sizes and dtypes, every layer a module; the first thing that does
not fit raises :class:`~commsched.errors.PlanMismatchError` naming it.
"""

from __future__ import annotations

from torch import nn

from commsched.errors import PlanMismatchError
from commsched.layers import layer_module
from commsched.runtime.warmup import dtype_name
from commsched.schedule import CommPlan


class BoundPlan:
    """A plan bound to a live model: the parameter of each plan tensor, the module of each layer."""

    __slots__ = ("modules", "params", "tensors_of_layer")

    def __init__(self, params: list[nn.Parameter], modules: list[nn.Module], tensors_of_layer: list[list[int]]) -> None:
        self.params = params
        self.modules = modules
        self.tensors_of_layer = tensors_of_layer


def bind_plan(model: nn.Module, plan: CommPlan, world: int) -> BoundPlan:
    """Map ``plan`` onto ``model`` by names; PlanMismatchError naming the first thing that does not fit."""
    w = plan.workload
    if plan.network.world_size != world:
        raise PlanMismatchError(
            f"plan: made for {plan.network.world_size} rank(s), this run has {world}; make it again for {world}"
        )
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    planned = {t.name for t in w.tensors}
    extra = sorted(set(named) - planned)
    if extra:
        raise PlanMismatchError(f"plan: the model has parameter(s) the plan does not: {', '.join(extra[:5])}")
    params: list[nn.Parameter] = []
    for tensor in w.tensors:
        p = named.get(tensor.name)
        if p is None:
            raise PlanMismatchError(f"plan: parameter {tensor.name!r} of the plan is not a trainable one of the model")
        if p.numel() != tensor.numel or dtype_name(p) != tensor.dtype:
            raise PlanMismatchError(
                f"plan: parameter {tensor.name!r} has {tensor.numel} {tensor.dtype} elements in the plan, "
                f"{p.numel()} {dtype_name(p)} in the model"
            )
        params.append(p)
    modules = []
    for layer in w.layers:
        try:
            modules.append(layer_module(model, layer.name))
        except KeyError:
            raise PlanMismatchError(f"plan: layer {layer.name!r} is not a module of the model") from None
    tensors_of_layer: list[list[int]] = [[] for _ in w.layers]
    for t, li in enumerate(w.tensor_layer):
        tensors_of_layer[li].append(t)
    return BoundPlan(params, modules, tensors_of_layer)
