"""Flows on a fabric without a training job: for closed-form tests, the ns-3 comparison and speed.

``run_flows(fabric, flows, config)`` starts each :class:`Flow` (a message on a
fresh connection) at its start time and returns its completion time: from
the start until the receiver holds every byte in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from commsched.sim.collector import collector_paused
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.connection import Connection
from commsched.sim.packet.fabric import Fabric
from commsched.sim.packet.registry import TRANSPORTS
from commsched.sim.packet.transport import MessageSpec


@dataclass(frozen=True)
class Flow:
    """``nbytes`` from host ``src`` to host ``dst``, starting at ``start_s``, in traffic class ``cls``.

    ``loss_bound``: the share of its (4-byte) elements a bounded-loss transport may give up on (DLCP; TCP
    delivers everything whatever it says); ``cls`` is also its layer class there. ``transport``: a
    name in TRANSPORTS for this flow ('': ``config.transport``).
    """

    src: int
    dst: int
    nbytes: int
    start_s: float = 0.0
    cls: int = 0
    loss_bound: float = 0.0
    transport: str = ""  # "": the config's


@dataclass(frozen=True)
class FlowResult:
    flow: Flow
    fct_s: float
    drops: int
    marks: int
    retransmits: int
    timeouts: int = 0
    recoveries: int = 0
    sender: Any = field(default=None, repr=False, compare=False)
    receiver: Any = field(default=None, repr=False, compare=False)


def run_flows(fabric: Fabric, flows: list[Flow], config: PacketConfig) -> list[FlowResult]:
    """Run ``flows`` to completion on ``fabric``, one connection each; results in the order given."""
    conns: list[Connection] = []
    end_s = [-1.0] * len(flows)
    for i, flow in enumerate(flows):
        sender, receiver = TRANSPORTS[flow.transport or config.transport](config, flow.cls)
        conn = Connection(fabric, flow.src, flow.dst, flow.cls, sender, receiver, fabric.rng.getrandbits(32))
        conns.append(conn)

        def done(i: int = i) -> None:
            end_s[i] = fabric.now

        def start(_: None, conn: Connection = conn, flow: Flow = flow, done: Callable[[], None] = done) -> None:
            conn.message(flow.nbytes, done, MessageSpec(flow.loss_bound, flow.cls))

        fabric.schedule_timer(flow.start_s, start, None)
    with collector_paused():
        fabric.run()
    out = []
    for flow, conn, end in zip(flows, conns, end_s, strict=True):
        if end < 0:
            raise RuntimeError(f"packet: flow {flow} never completed")
        sender = conn.sender
        counts = [getattr(sender, name, 0) for name in ("retransmits", "timeouts", "recoveries")]
        result = FlowResult(flow, end - flow.start_s, conn.drops, conn.marks, *counts)
        out.append(replace(result, sender=conn.sender, receiver=conn.receiver))
    return out
