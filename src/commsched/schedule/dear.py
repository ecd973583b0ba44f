"""DeAR: decoupled all-reduce with tensor fusion.

Zhang, Shi, Chu, Wang, Li, Liu, "DeAR: Accelerating Distributed Deep Learning
with Fine-Grained All-Reduce Pipelining", ICDCS 2023 (arXiv 2302.12445).

Layers are fused, in forward order, into groups whose gradient bytes stay
below ``threshold_mb`` (a layer larger than the threshold is its own group;
layers are never split). During backward, each group is **reduce-scattered**
as soon as all of its gradients are ready. At ``optimizer.step()`` the
all-gathers of groups 0 .. k-1 are launched; during the next forward, when
the first layer of group g is about to run, the all-gather of group g+k is
launched (``lookahead`` k; the paper's code uses one group), and each layer's
update is applied just before its forward, once its group's all-gather has
finished (``update="forward"``). All-gathers run in group order whatever k
is; a larger k only issues them earlier, which keeps the link busy when the
forward is faster than the all-gathers (slow links), at the price of gathers
competing with nothing else the forward needs sooner.

RS + AG move exactly the bytes of one all-reduce, so the plan moves the same
bytes as DDP. Differences from the authors' code, on purpose: the forward
order is the recorded one (not registration order); any ``torch.optim``
optimizer runs the update; an update is applied once per step; all-gathers the
forward did not reach are launched before the next backward or on flush.

Guarantee: lossless; identical to plain synchronous SGD.
Knobs: ``threshold_mb`` (25, the default of the paper's code), ``lookahead``
(1, the paper's code; a whole number >= 1: groups whose all-gather is in flight
ahead of the forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, ReadyTracker, Scheduler, UpdateMode
from commsched.schedule.fusion import fuse_below_threshold, make_task, whole
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import mb_to_bytes
from commsched.workload import Workload


@dataclass(frozen=True)
class DeARKnobs(Knobs):
    policy: ClassVar[str] = "dear"
    threshold_mb: float = knob(25.0, gt=0, doc="fusion threshold of a group, MiB")
    lookahead: int = knob(1, ge=1, doc="groups whose all-gather is in flight ahead of the forward")


def group_layers(workload: Workload, threshold_bytes: int) -> list[list[int]]:
    """Consecutive layers (forward order) fused while the group stays below the threshold."""
    layers = [li for li, layer in enumerate(workload.layers) if layer.tensors]
    return fuse_below_threshold(layers, [layer.bytes for layer in workload.layers], threshold_bytes)


class DeARScheduler(Scheduler):
    name: ClassVar[str] = "dear"
    knob_type: ClassVar[type[Knobs]] = DeARKnobs
    update_mode: ClassVar[UpdateMode] = "forward"

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, DeARKnobs)
        tasks = []
        first_tensor = [0]
        for layer in workload.layers:
            first_tensor.append(first_tensor[-1] + len(layer.tensors))
        for g, layers in enumerate(group_layers(workload, mb_to_bytes(knobs.threshold_mb))):
            tensors = [t for li in layers for t in range(first_tensor[li], first_tensor[li + 1])]
            segs = whole(workload, tensors)
            tasks.append(make_task(workload, 2 * g, "reduce_scatter", segs, f"rs{g}", g))
            tasks.append(make_task(workload, 2 * g + 1, "all_gather", segs, f"ag{g}", g, deps=(2 * g,)))
        return CommPlan(cls.name, workload, network, tuple(tasks), "forward", knobs)

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        assert isinstance(plan.knobs, DeARKnobs)
        self.num_groups = len(plan.tasks) // 2
        self.lookahead = plan.knobs.lookahead
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
        return self._gather_up_to(self.lookahead - 1)

    def on_forward_pre(self, layer: int) -> Sequence[Action]:
        g = self.group_of_layer[layer]
        return self._gather_up_to(g + self.lookahead) if g >= 0 else ()

    def on_flush(self) -> Sequence[Action]:
        return self._gather_up_to(self.num_groups - 1)
