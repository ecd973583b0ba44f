"""PS: a parameter server with partitions, layer priority and a credit window (BytePS-style).

Jiang, Zhu, Lan, Yi, Cui, Guo, "A Unified Architecture for Accelerating
Distributed DNN Training in Heterogeneous GPU/CPU Clusters" (BytePS), OSDI
2020; the parameter server of Li et al., "Scaling Distributed Machine
Learning with the Parameter Server", OSDI 2014; the priority and credit
scheduling of Peng et al., ByteScheduler, SOSP 2019
(:mod:`commsched.schedule.bytescheduler`).

Each tensor is cut into partitions of at most ``partition_mb`` (BytePS cuts
at about 4 MB by default); a tensor smaller than ``fuse_kb`` (a bias, a
norm's scale and shift, a small layer) joins the partition before it while
that stays within ``partition_mb``, so that it does not cost a push, a pull
and their messages of its own. A partition is one **push** (every rank sends its
gradient to the servers that own it; they sum) and one **pull** (every rank
fetches the sums), both on the ``"ps"`` transport
(:data:`~commsched.schedule.base.PS_TRANSPORT`). In the runtime a server runs
on every rank and each partition is sharded over all of them, so every rank
sends and receives ``(p-1)/p`` of the partition per push and per pull — the
bytes of a ring reduce-scatter and all-gather, with one startup instead of
``p - 1`` (:mod:`commsched.transport.exchange`). The simulator prices the
tasks under its ``ps`` cost model: the cluster's servers where its spec lists
some, else a server on every worker.

Scheduling: ready partitions wait in a priority queue ordered by layer (the
layer nearest the input first), then by position. A push is launched while
the bytes of partitions in flight are below ``credit_mb`` (the check is
``in_flight < credit``, so one launch may overshoot, as in ByteScheduler); a
partition's pull is launched as soon as its push has finished, and its credit
returns when the pull has finished. The window keeps a few partitions on the
wire, so a front layer's partition overtakes everything still queued.

Update mode: ``"forward"``, as ByteScheduler's cross-barrier: each layer is
updated just before its next forward, once the pulls carrying its gradients
have finished. Priority to the front layers pays off only this way — under
``"step"`` every layer would wait for the last pull, whatever its order — so
layer 0's pull finishing first lets the next forward start while the back
layers are still being pulled. (Deferred updates cannot run with a
``GradScaler``; the runtime says so at once.)

Decisions depend on completion times (the window, and a pull after its
push), so in the runtime rank 0 decides and the other ranks follow its order.

Guarantee: lossless (every task's ``loss_bound`` is 0): each element is
summed once, by the server that owns it, and every rank receives that sum,
so training equals synchronous SGD up to the float association order.
Knobs: ``partition_mb`` (4), ``credit_mb`` (16: four default partitions in
flight), ``fuse_kb`` (none: from the network, :func:`fuse_bytes`; 0: every
tensor on its own, as BytePS). A tensor is fused where sending it alone
would cost more in a message's fixed cost than in its time on the wire: below
``bandwidth x (latency + CPU per task)``, and at least below 64 KiB. Fusing at
64 KiB took 10-16 % less time than 0 unshaped (0.83-0.85x default DDP in the
same runs, against 0.72-0.74x) and alike at 300 Mbit/s (1.14-1.17x default
DDP, against 1.10-1.15x; resnet5m, 2 workers; BENCHMARKS.md, "The ps
transport's small tensors fused"). At a fixed 1024 KiB (9 partitions of
resnet5m instead of 17) ``ps`` ran unshaped at 0.98x ``torch_ddp``, but at
300 Mbit/s 2-3 % slower than at 64 (BENCHMARKS.md, "``ps`` with 1 MiB
fusion"): no one size suits both, and the rule gives each network its own
(64 KiB at 300 Mbit/s, where a 64 KiB tensor is 1.7 ms on the wire; unshaped,
11 partitions of resnet5m: 0.947-0.972x ``torch_ddp`` in three runs, where
64 KiB gave 0.943-0.959x, and 300 Mbit/s as before; BENCHMARKS.md, "``ps``
sizes its fusion from the network"). ``auto`` takes the rule's size too: its
knob search leaves a knob whose default is none at that default
(:func:`commsched.plan.tune.search_space`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from commsched.schedule.base import (
    PS_TRANSPORT,
    Action,
    CommTask,
    Launch,
    NetworkEstimate,
    ReadyTracker,
    Scheduler,
    Segment,
    UpdateMode,
)
from commsched.schedule.bytescheduler import CreditQueue
from commsched.schedule.fusion import layer_priority, make_task, partition, segments_bytes
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.units import kib_to_bytes, mb_to_bytes
from commsched.workload import Workload

FUSE_DOC = "a tensor below this joins the partition before it, KiB (0: none)"


@dataclass(frozen=True)
class PSKnobs(Knobs):
    policy: ClassVar[str] = "ps"
    partition_mb: float = knob(4.0, gt=0, doc="largest partition, MiB")
    credit_mb: float = knob(16.0, gt=0, doc="bytes of partitions in flight (push to pull), MiB")
    fuse_kb: float | None = knob(None, ge=0, doc=FUSE_DOC + "; none: from the network", before=0.0)


#: The least size below which :func:`fuse_bytes` fuses, KiB, however fast the network (measured: the knob's doc).
FUSE_FLOOR_KB = 64.0


def fuse_bytes(fuse_kb: float | None, network: NetworkEstimate) -> int:
    """The size below which a tensor joins the partition before it: ``fuse_kb`` where given, else the bytes the
    network carries in one task's fixed cost (its latency and the CPU a ``"ps"`` task costs, measured apart in
    the warm-up where it was, else a message's), and at least :data:`FUSE_FLOOR_KB`.

    A tensor smaller than that spends more of its push (and of its pull) on the message than on the wire, and
    every message also costs the core that computes (unshaped, resnet5m: 1.8 GB/s, 0.1-0.5 ms a task).
    """
    if fuse_kb is not None:
        return kib_to_bytes(fuse_kb)
    per_task_s = next((s for name, s, _ in network.transport_cpu if name == PS_TRANSPORT), network.cpu_per_message_s)
    on_the_wire = network.bandwidth_bytes_per_s * (network.latency_s + per_task_s)
    return max(kib_to_bytes(FUSE_FLOOR_KB), int(on_the_wire))


def push_pull_tasks(workload: Workload, partition_bytes: int, fuse_bytes: int = 0) -> list[CommTask]:
    """Per partition: a push (id ``2k``) and its pull (id ``2k + 1``, depending on the push).

    Tensors are taken in order and cut into pieces of at most ``partition_bytes``; a tensor smaller than
    ``fuse_bytes`` joins the partition before it instead (a layer's bias and norm join its weight) where that
    stays within ``partition_bytes``. A partition is ready when all of its tensors are, and a small tensor
    after a large one is ready before it in backward, so fusing delays no partition.
    """
    pieces: list[tuple[list[str], list[Segment]]] = []  # each partition's name parts and segments
    for t, tensor in enumerate(workload.tensors):
        last = pieces[-1][1] if pieces else []
        if last and tensor.bytes < fuse_bytes and segments_bytes(workload, last) + tensor.bytes <= partition_bytes:
            pieces[-1][0].append(tensor.name)
            last.append(Segment(t, 0, tensor.numel))
        else:
            pieces += [([f"{tensor.name}#{k}"], [seg]) for k, seg in enumerate(partition(workload, t, partition_bytes))]
    tasks: list[CommTask] = []
    for names, segs in pieces:
        name = "+".join(names)
        push_id = len(tasks)
        prio = layer_priority(workload, segs)
        tasks.append(make_task(workload, push_id, "push", segs, f"push:{name}", prio, transport=PS_TRANSPORT))
        deps = (push_id,)
        tasks.append(make_task(workload, push_id + 1, "pull", segs, f"pull:{name}", prio, deps, transport=PS_TRANSPORT))
    return tasks


class PSScheduler(Scheduler):
    name: ClassVar[str] = "ps"
    knob_type: ClassVar[type[Knobs]] = PSKnobs
    update_mode: ClassVar[UpdateMode] = "forward"
    uses_completions: ClassVar[bool] = True

    @classmethod
    def transports(cls, knobs: Knobs) -> frozenset[str]:
        return frozenset({PS_TRANSPORT})

    @classmethod
    def plans_with_cpu_of(cls, knobs: Knobs) -> frozenset[str]:
        assert isinstance(knobs, PSKnobs)
        return frozenset({PS_TRANSPORT}) if knobs.fuse_kb is None else frozenset()  # fuse_bytes reads it

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, PSKnobs)
        fuse = fuse_bytes(knobs.fuse_kb, network)
        tasks = push_pull_tasks(workload, mb_to_bytes(knobs.partition_mb), fuse)
        # the plan records the size it fused at (a run's record replays it, whatever network predicts it)
        return CommPlan(cls.name, workload, network, tuple(tasks), "forward", replace(knobs, fuse_kb=fuse / 1024))

    def __init__(self, plan: CommPlan) -> None:
        super().__init__(plan)
        assert isinstance(plan.knobs, PSKnobs)
        self._queue = CreditQueue(plan, mb_to_bytes(plan.knobs.credit_mb))
        self._tracker = ReadyTracker(plan, (task.id for task in plan.tasks if task.kind == "push"))

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        for task in self._tracker.mark(tensor):  # a push once every tensor of its partition is ready
            self._queue.push(task)
        return self._queue.drain()

    def on_step(self) -> Sequence[Action]:
        self._tracker.reset(self.plan)
        return ()

    def on_comm_done(self, task: int) -> Sequence[Action]:
        if self.plan.tasks[task].kind == "push":
            return [Launch(task + 1)]  # its pull, at once: the partition keeps its credit
        self._queue.done(task - 1)  # the pull finished: the partition's credit returns
        return self._queue.drain()
