"""MG-WFBP: wait-free backpropagation with gradients merged where a startup costs more than a wait.

Shi, Chu, Li, "MG-WFBP: Efficient Data Communication for Distributed
Synchronous SGD Algorithms", INFOCOM 2019. The rule below is the one of the
authors' implementation (``_generate_groups_mgwfbp`` in the MG-WFBP baseline of
DeAR's artifact, ``lzhangbv/dear_pytorch``, ``mgwfbp/dopt.py``; summarised in
``research/dear.md`` §5.3).

An all-reduce of ``n`` bytes costs ``T(n) = a + b·n`` (a fitted line; here
``a = T(0)`` and ``b`` come from the plan's :class:`NetworkEstimate`, the
ring all-reduce ``2(p-1)·α + 2(p-1)/p · n / B``, so ``a = 2(p-1)·α`` is the
whole startup of one all-reduce). Gradients are taken in ready order with
ready times ``r_1 <= r_2 <= ...`` (the profile's gradient-ready times). The
current group ``G`` (a run of consecutive gradients ending at ``i``) would
start at ``τ = max(end of the previous group, r_i)`` and end at
``τ + T(bytes(G))``. Gradient ``i+1`` is **merged** into ``G`` when it is ready
before ``G``'s all-reduce would end, ``r_{i+1} < τ + T(bytes(G))``, and either

* ``G`` would not have started yet, ``τ > r_{i+1}`` (merging costs nothing), or
* the wait it adds is shorter than the startup it saves, ``r_{i+1} - τ < a``;

otherwise ``G`` is closed and ``i+1`` starts a new group. With ``a = 0`` only
the first case merges; with a large ``a`` everything becomes one all-reduce.

Groups are all-reduced in ready order, each as soon as all its gradients are
ready (a later group never overtakes an earlier one, so every rank issues the
same sequence); the optimizer runs at ``step()`` after every all-reduce.

Guarantee: lossless; identical to plain synchronous SGD.
Knobs: ``alpha_ms`` (None: ``a`` from the network estimate; else the whole
startup ``a`` of one all-reduce, ms), ``bandwidth_gbps`` (None: the
estimate's bandwidth; else it replaces ``B``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from commsched.schedule.base import BucketsInOrder, NetworkEstimate
from commsched.schedule.fusion import layer_priority, make_task, ready_order, whole
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import gbps_to_bytes_per_s
from commsched.workload import Workload


@dataclass(frozen=True)
class MGWFBPKnobs(Knobs):
    policy: ClassVar[str] = "mgwfbp"
    alpha_ms: float | None = knob(None, ge=0, doc="startup of one all-reduce, ms (none: from the network estimate)")
    bandwidth_gbps: float | None = knob(None, gt=0, doc="overrides the estimated bandwidth, Gbit/s")


def allreduce_line(network: NetworkEstimate, knobs: MGWFBPKnobs) -> tuple[float, float]:
    """``(a, b)`` of ``T(n) = a + b·n`` in seconds and seconds per byte (module docstring)."""
    if knobs.bandwidth_gbps is not None:
        network = NetworkEstimate(network.world_size, gbps_to_bytes_per_s(knobs.bandwidth_gbps), network.latency_s)
    a = network.allreduce_s(0) if knobs.alpha_ms is None else knobs.alpha_ms / 1e3
    probe = 1 << 20
    b = (network.allreduce_s(probe) - network.allreduce_s(0)) / probe
    return a, b


def merge_groups(ready_s: Sequence[float], sizes: Sequence[int], a: float, b: float) -> list[list[int]]:
    """MG-WFBP's merge rule over items already in ready order; returns groups of item positions.

    ``ready_s[i]``: when item ``i`` is ready (non-decreasing), ``sizes[i]`` its bytes,
    ``T(n) = a + b·n`` the all-reduce time.
    """
    groups: list[list[int]] = []
    if not ready_s:
        return groups
    previous_end = 0.0
    current = [0]
    current_bytes = sizes[0]
    for i in range(1, len(ready_s)):
        start = max(previous_end, ready_s[i - 1])
        end = start + a + b * current_bytes
        merge = ready_s[i] < end and (start > ready_s[i] or ready_s[i] - start < a)
        if merge:
            current.append(i)
            current_bytes += sizes[i]
            continue
        groups.append(current)
        previous_end = end
        current, current_bytes = [i], sizes[i]
    groups.append(current)
    return groups


class MGWFBPScheduler(BucketsInOrder):
    name: ClassVar[str] = "mgwfbp"
    knob_type: ClassVar[type[Knobs]] = MGWFBPKnobs

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, MGWFBPKnobs)
        a, b = allreduce_line(network, knobs)
        order = ready_order(workload)
        ready = [workload.grad_ready_ms[t] / 1e3 for t in order]
        sizes = [workload.tensors[t].bytes for t in order]
        tasks = []
        for i, positions in enumerate(merge_groups(ready, sizes, a, b)):
            segs = whole(workload, [order[p] for p in positions])
            tasks.append(make_task(workload, i, "all_reduce", segs, f"merged{i}", layer_priority(workload, segs)))
        return CommPlan(cls.name, workload, network, tuple(tasks), "step", knobs)
