"""DLCP: bounded-loss, prioritised push/pull of gradient partitions.

Wang et al., "Domain-specific Communication Optimization for Distributed DNN
Training" (DLCP), arXiv 2008.08445, 2020; published as "Towards
Domain-Specific Network Transport for Distributed DNN Training" (MLT), NSDI
2024. SGD tolerates a small, bounded fraction of lost gradient entries, so the
transport stops waiting for a tensor once ``1 − loss_bound`` of it has
arrived: no retransmission timeout, no incast tail on the synchronous path.

The schedule is the parameter server's (:mod:`commsched.schedule.ps`): each
tensor cut into partitions, a **push** and a **pull** per partition, the
front layers first under a credit window, updates applied per layer before
its next forward. What changes is the transport and the bounds:

* ``mode="collective"``: transport ``"dlcp"``, every rank owns a shard of
  each partition (DLCP's ring setting realised as a transpose all-reduce, as
  OptiReduce does: each rank reduces its own shard from every peer, then
  sends it back, so a lost datagram damages one exchange, not a ring);
* ``mode="ps"``: transport ``"dlcp_ps"``, one server (rank 0) owns every
  partition: DLCP's parameter-server setting, with its incast.

A push may give up on ``loss_bound`` of its elements (missing gradient
entries count as zero); a pull on ``pull_loss_bound`` (default 0: reliable;
a missing entry keeps the previous iteration's sum). The transport decides
which packets matter (layer class, chunk magnitude) and how they cross the
network (ECN capability, DSCP priority, spraying over ``paths``).

Guarantee: bounded loss, not lossless — at most ``loss_bound`` of each push
and ``pull_loss_bound`` of each pull are missing, and with nothing lost the
result equals synchronous SGD (DDP's parameters up to float association).
``auto`` and ``advise`` leave it out: the flow-level simulator prices its
tasks as a lossless parameter server (the bytes not waited for are not what
DLCP gains; its gain is the tail of retransmissions and incast, which only
the packet-level network shows), so its predictions there are unvalidated;
with ``network=packet`` its tasks run on DLCP's own state machines and are not.

Knobs: ``partition_mb`` (4), ``credit_mb`` (16) and ``fuse_kb`` (64) as the
parameter server's (a small tensor rides in the partition before it: every
transfer costs DLCP a STOP, ACKs and often a PROBE), ``loss_bound`` (0.01),
``pull_loss_bound`` (0), ``mode`` (``collective``), ``paths`` (1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from commsched.schedule.base import NetworkEstimate
from commsched.schedule.knobs import Knobs, knob
from commsched.schedule.plan import CommPlan
from commsched.schedule.ps import FUSE_DOC, PSKnobs, PSScheduler, push_pull_tasks
from commsched.units import kib_to_bytes, mb_to_bytes
from commsched.workload import Workload

#: Transport of ``mode="collective"``: bounded-loss datagrams, a shard of each partition on every rank.
DLCP_TRANSPORT = "dlcp"
#: Transport of ``mode="ps"``: bounded-loss datagrams, rank 0 the server of every partition.
DLCP_PS_TRANSPORT = "dlcp_ps"
DLCP_TRANSPORTS: dict[str, str] = {"collective": DLCP_TRANSPORT, "ps": DLCP_PS_TRANSPORT}


@dataclass(frozen=True)
class DLCPKnobs(PSKnobs):
    """The parameter server's knobs (``partition_mb``, ``credit_mb``, ``fuse_kb``) and DLCP's."""

    policy: ClassVar[str] = "dlcp"
    #: Fused by default, unlike ``ps``: a transfer's control messages cost DLCP's Python data path far more than
    #: TCP's (BENCHMARKS.md, "Small tensors fused": ``dlcp`` 1.30-1.45x ``ps`` unfused, 1.12-1.18x fused at 64).
    fuse_kb: float = knob(64.0, ge=0, doc=FUSE_DOC, before=0.0)
    loss_bound: float = knob(0.01, ge=0, lt=1, doc="largest fraction of each push's elements not waited for")
    pull_loss_bound: float = knob(0.0, ge=0, lt=1, doc="the same for each pull of the sums (0: reliable)")
    mode: str = knob("collective", choices=("collective", "ps"), doc="shards on every rank, or one server")
    paths: int = knob(1, ge=1, doc="network paths packets are sprayed over")


class DLCPScheduler(PSScheduler):
    name: ClassVar[str] = "dlcp"
    knob_type: ClassVar[type[Knobs]] = DLCPKnobs
    lossless: ClassVar[bool] = False

    @classmethod
    def transports(cls, knobs: Knobs) -> frozenset[str]:
        assert isinstance(knobs, DLCPKnobs)
        return frozenset({DLCP_TRANSPORTS[knobs.mode]})

    @classmethod
    def build_plan(cls, workload: Workload, network: NetworkEstimate, knobs: Knobs) -> CommPlan:
        assert isinstance(knobs, DLCPKnobs)
        transport = DLCP_TRANSPORTS[knobs.mode]
        tasks = [
            replace(
                task,
                transport=transport,
                loss_bound=knobs.loss_bound if task.kind == "push" else knobs.pull_loss_bound,
            )
            for task in push_pull_tasks(workload, mb_to_bytes(knobs.partition_mb), kib_to_bytes(knobs.fuse_kb))
        ]
        return CommPlan(cls.name, workload, network, tuple(tasks), "forward", knobs)
