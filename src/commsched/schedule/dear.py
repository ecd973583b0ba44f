"""DeAR: decoupled all-reduce with tensor fusion.

Zhang, Shi, Chu, Wang, Li, Liu, "DeAR: Accelerating Distributed Deep Learning
with Fine-Grained All-Reduce Pipelining", ICDCS 2023 (arXiv 2302.12445).

Layers are fused, in forward order, into groups whose gradient bytes stay
below ``threshold_mb`` (a layer larger than the threshold is its own group;
layers are never split). During backward, each group is **reduce-scattered**
as soon as all of its gradients are ready. At ``optimizer.step()`` the
all-gather of group 0 is launched; during the next forward, when the first
layer of group g is about to run, the all-gather of group g+1 is launched (one
group of look-ahead), and each layer's update is applied just before its
forward, once its group's all-gather has finished (``update="forward"``).

RS + AG move exactly the bytes of one all-reduce, so the plan moves the same
bytes as DDP. Differences from the authors' code, on purpose: the forward
order is the recorded one (not registration order); any ``torch.optim``
optimizer runs the update; an update is applied once per step; all-gathers the
forward did not reach are launched before the next backward or on flush.

Guarantee: lossless; identical to plain synchronous SGD.
Knobs: ``threshold_mb`` (25, the default of the paper's code).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, Plan, ReadyTracker, Scheduler
from commsched.schedule.fusion import make_task, whole
from commsched.workload import Workload

MiB = 1024 * 1024


def group_layers(workload: Workload, threshold_bytes: int) -> list[list[int]]:
    """Consecutive layers (forward order) fused while the group stays below the threshold."""
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for li, layer in enumerate(workload.layers):
        if not layer.tensors:
            continue
        if current and current_bytes + layer.bytes >= threshold_bytes:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(li)
        current_bytes += layer.bytes
    if current:
        groups.append(current)
    return groups


class DeARScheduler(Scheduler):
    name: ClassVar[str] = "dear"

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, threshold_mb: float = 25.0) -> Plan:
        tasks = []
        first_tensor = [0]
        for layer in workload.layers:
            first_tensor.append(first_tensor[-1] + len(layer.tensors))
        for g, layers in enumerate(group_layers(workload, int(threshold_mb * MiB))):
            tensors = [t for li in layers for t in range(first_tensor[li], first_tensor[li + 1])]
            segs = whole(workload, tensors)
            tasks.append(make_task(workload, 2 * g, "reduce_scatter", segs, f"rs{g}", g))
            tasks.append(make_task(workload, 2 * g + 1, "all_gather", segs, f"ag{g}", g, deps=(2 * g,)))
        return Plan(cls.name, workload, tuple(tasks), "forward", {"threshold_mb": threshold_mb})

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.num_groups = len(plan.tasks) // 2
        self.group_of_layer = [-1] * len(plan.workload.layers)
        for g in range(self.num_groups):
            for t in plan.tasks[2 * g].tensors:
                self.group_of_layer[plan.workload.tensor_layer[t]] = g
        self._tracker = ReadyTracker(plan)
        self._gathers_owed = 0  # all-gathers of groups >= this index are not launched yet
        self._stepped = False  # an iteration's reduce-scatters ended with step(): gathers are owed
        self._in_backward = False

    def _gather_up_to(self, group: int) -> list[Action]:
        out: list[Action] = []
        while self._stepped and self._gathers_owed <= min(group, self.num_groups - 1):
            out.append(Launch(2 * self._gathers_owed + 1))
            self._gathers_owed += 1
        return out

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        out: list[Action] = []
        if not self._in_backward:
            # A new backward overwrites the group buffers: settle last step's gathers first.
            out += self._gather_up_to(self.num_groups - 1)
            self._in_backward = True
        out += [Launch(task) for task in self._tracker.mark(tensor)]
        return out

    def on_step(self) -> Sequence[Action]:
        self._tracker.reset(self.plan)
        self._in_backward = False
        self._stepped = True
        self._gathers_owed = 0
        return self._gather_up_to(0)

    def on_forward_pre(self, layer: int) -> Sequence[Action]:
        g = self.group_of_layer[layer]
        return self._gather_up_to(g + 1) if g >= 0 else ()

    def on_flush(self) -> Sequence[Action]:
        return self._gather_up_to(self.num_groups - 1)
