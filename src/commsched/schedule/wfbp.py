"""Wait-free backpropagation: one all-reduce per tensor, launched as soon as it is ready.

Zhang et al., "Poseidon: An Efficient Communication Architecture for
Distributed Deep Learning on GPU Clusters", ATC 2017. No fusion: every tensor
pays its own startup latency, which is what fusion-based policies avoid.
The optimizer runs at ``step()`` after every all-reduce finished.

Guarantee: lossless. Knobs: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import Action, Launch, NetworkEstimate, Scheduler
from commsched.schedule.fusion import layer_priority, make_task, whole
from commsched.schedule.knobs import Knobs
from commsched.schedule.plan import CommPlan
from commsched.workload import Workload


@dataclass(frozen=True)
class WFBPKnobs(Knobs):
    policy: ClassVar[str] = "wfbp"


class WFBPScheduler(Scheduler):
    name: ClassVar[str] = "wfbp"
    knob_type: ClassVar[type[Knobs]] = WFBPKnobs

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        tasks = []
        for t, tensor in enumerate(workload.tensors):
            segs = whole(workload, [t])
            tasks.append(make_task(workload, t, "all_reduce", segs, tensor.name, layer_priority(workload, segs)))
        return CommPlan(cls.name, workload, network, tuple(tasks), "step", knobs)

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        return (Launch(tensor),)
