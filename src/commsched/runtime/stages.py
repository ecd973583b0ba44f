"""A plan's pipeline stages bound to a live ``nn.Sequential``: which children each stage runs.

A stage is a range of the plan's layers (``CommPlan.stages``); the runtime
runs it as a range of the ``nn.Sequential``'s children, so every cut must
fall between two children: stage ``s`` runs the children from the one that
holds its first layer up to the one that holds the next stage's first layer
(stage 0 from child 0, the last stage to the end, so children without
parameters go with the layers before them). Checked at ``parallelize()``:
the model is an ``nn.Sequential`` whose parameters are the plan's
(:func:`~commsched.runtime.binding.bind_plan`), every layer is inside a child,
no child holds layers of two stages, no parameter is shared by two stages,
and every task reduces the tensors of one stage on the ``"collective"``
transport. The first problem raises :class:`~commsched.errors.PlanMismatchError`
(or UnsupportedError for what the pipeline runtime cannot run), naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from commsched.errors import PlanMismatchError, UnsupportedError
from commsched.runtime.binding import bind_plan
from commsched.schedule import CommPlan
from commsched.schedule.base import COLLECTIVE
from commsched.schedule.stages import StageLayout


@dataclass(frozen=True)
class BoundStages:
    """The layout on the model: children per stage, and the stage each task of the plan reduces."""

    layout: StageLayout
    children: tuple[range, ...]
    task_stage: tuple[int, ...]
    params: tuple[nn.Parameter, ...]
    stage_of_tensor: tuple[int, ...]


def bind_stages(model: nn.Module, plan: CommPlan, world: int) -> BoundStages:
    """``plan``'s stages on ``model`` (module docstring); PlanMismatchError or UnsupportedError otherwise."""
    layout = plan.stages
    assert layout is not None
    if not isinstance(model, nn.Sequential):
        raise UnsupportedError(
            f"plan: pipeline stages run on an nn.Sequential (stages are ranges of its children), got "
            f"{type(model).__name__}; wrap the model's blocks in an nn.Sequential"
        )
    bound = bind_plan(model, plan, world)
    w = plan.workload
    names = list(model._modules)
    child_of: list[int] = []
    for layer in w.layers:
        head = layer.name.split(".")[0]
        if head not in model._modules:
            raise PlanMismatchError(f"plan: layer {layer.name!r} is not inside a child of the nn.Sequential")
        child_of.append(names.index(head))
    for s in range(1, layout.num_stages):
        first = layout.starts[s]
        if child_of[first - 1] == child_of[first]:
            raise PlanMismatchError(
                f"plan: stage {s} starts at layer {w.layers[first].name!r}, inside child {names[child_of[first]]!r} "
                f"of the nn.Sequential, which also holds layer {w.layers[first - 1].name!r} of stage {s - 1}; "
                "stage cuts must fall between children"
            )
    first_child = [0] + [child_of[layout.starts[s]] for s in range(1, layout.num_stages)] + [len(names)]
    for li, layer in enumerate(w.layers):
        s = layout.stage_of_layer(li)
        if not first_child[s] <= child_of[li] < first_child[s + 1]:
            raise PlanMismatchError(
                f"plan: stage {s} holds layer {layer.name!r} of child {names[child_of[li]]!r} of the nn.Sequential, "
                f"outside the children {first_child[s]}..{first_child[s + 1] - 1} it runs; stage cuts must fall "
                "between children, in forward order"
            )
    stage_of_tensor = tuple(layout.stage_of_layer(w.tensor_layer[t]) for t in range(len(w.tensors)))
    seen: dict[int, int] = {}
    for t, p in enumerate(bound.params):
        if seen.setdefault(id(p), stage_of_tensor[t]) != stage_of_tensor[t]:
            raise UnsupportedError(f"plan: parameter {w.tensors[t].name!r} is shared by two stages")
    task_stage = []
    for task in plan.tasks:
        stages = {stage_of_tensor[t] for t in task.tensors}
        if len(stages) != 1 or task.kind != "all_reduce" or task.transport != COLLECTIVE:
            raise UnsupportedError(
                f"plan: task {task.name!r} ({task.kind} on {task.transport!r}, stages {sorted(stages)}): with "
                "pipeline stages every task is an all_reduce on the 'collective' transport within one stage"
            )
        task_stage.append(stages.pop())
    children = tuple(range(first_child[s], first_child[s + 1]) for s in range(layout.num_stages))
    return BoundStages(layout, children, tuple(task_stage), tuple(bound.params), stage_of_tensor)
