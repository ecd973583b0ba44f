"""The packet model's traffic beyond lossless collectives: DLCP's push and pull, and background flows.

A mixin of :class:`~commsched.sim.packet.model.PacketNetwork` (which
documents both patterns), kept apart so that each file reads on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from commsched.schedule.base import CommTask
from commsched.schedule.dlcp import DLCP_TRANSPORT
from commsched.sim.packet.background import background_flows
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.connection import Connection
from commsched.sim.packet.dlcp import DlcpReceiver
from commsched.sim.packet.fabric import Fabric
from commsched.sim.packet.magnitudes import norms_for
from commsched.sim.packet.registry import TRANSPORTS
from commsched.sim.packet.scenario import Flow
from commsched.sim.packet.topology import Built
from commsched.sim.packet.transport import MessageSpec, TransportFactory
from commsched.transport.exchange_state import PULL, PUSH
from commsched.transport.slices import owner_slices
from commsched.workload import Workload

if TYPE_CHECKING:
    from commsched.sim.network import Collective


class ExtraTraffic:
    """DLCP messages and background flows on the network's fabric (needs the attributes declared here)."""

    config: PacketConfig
    fabric: Fabric
    workers: tuple[int, ...]
    dlcp_connections: dict[tuple[int, int], Connection]
    background_fcts: list[tuple[Flow, float]]
    _built: Built
    _finished: list[Collective]
    _launches: list[int]
    message_fcts: list[tuple[int, int, float]]
    _transport: TransportFactory
    _workload: Workload | None

    def _timed(self, launch: int, nbytes: int, done: Callable[[], None]) -> Callable[[], None]:
        """``done``, after noting the message's completion time in ``message_fcts`` (any transport)."""
        fabric, fcts, start_s = self.fabric, self.message_fcts, self.fabric.now

        def finished() -> None:
            fcts.append((launch, nbytes, fabric.now - start_s))
            done()

        return finished

    def _dlcp(self, coll: Collective, task: CommTask, launch: int) -> None:
        """DLCP's push and pull of ``task``'s slices, as the real exchange moves them (module docstring)."""
        hosts = self.workers
        p = len(hosts)
        numel = task.numel
        itemsize = max(1, task.bytes // max(1, numel))
        slices = owner_slices(numel, p, None if task.transport == DLCP_TRANSPORT else (0,))
        owners = [q for q, (a, b) in enumerate(slices) if b > a]
        push = task.kind in ("push", "reduce_scatter", "all_reduce")
        pull = task.kind in ("pull", "all_gather", "all_reduce")
        finished = self._finished
        left = [len(owners) * (p - 1) * (int(push) + int(pull))]

        def spec(bound: float, start: int, src: int, dst: int, phase: int) -> MessageSpec:
            norms = None
            if self._workload is not None:
                rng = np.random.default_rng((self.config.seed, task.id, launch, src, dst))
                norms = norms_for(self._workload, task, start, rng)
            return MessageSpec(bound, task.priority, itemsize, norms, phase, launch)  # launch n: iteration n

        def arrived() -> None:
            left[0] -= 1
            if left[0] == 0:
                finished.append(coll)

        def pull_from(q: int) -> None:
            a, b = slices[q]
            bound = task.loss_bound if task.kind == "pull" else 0.0
            for r in range(p):
                if r != q:
                    spec_qr = spec(bound, a, q, r, PULL)
                    self._dlcp_message(hosts[q], hosts[r], (b - a) * itemsize, arrived, spec_qr, launch)

        if left[0] == 0:
            self.fabric.schedule(self.fabric.now, lambda _: finished.append(coll), None)
            return
        for q in owners:
            if not push:
                pull_from(q)
                continue
            a, b = slices[q]
            pending = [p - 1]

            def pushed(q: int = q, pending: list[int] = pending) -> None:
                arrived()
                pending[0] -= 1
                if pending[0] == 0 and pull:
                    pull_from(q)

            for r in range(p):
                if r != q:
                    spec_rq = spec(task.loss_bound, a, r, q, PUSH)
                    self._dlcp_message(hosts[r], hosts[q], (b - a) * itemsize, pushed, spec_rq, launch)

    def _dlcp_message(
        self, src: int, dst: int, nbytes: int, done: Callable[[], None], spec: MessageSpec, launch: int
    ) -> None:
        done = self._timed(launch, nbytes, done)
        conn = self.dlcp_connections.get((src, dst))
        if conn is None:
            sender, receiver = TRANSPORTS["dlcp"](self.config, 0)
            conn = Connection(self.fabric, src, dst, 0, sender, receiver, self.fabric.rng.getrandbits(32))
            self.dlcp_connections[(src, dst)] = conn
        overhead = self._built.message_overhead_s(src, dst)
        if overhead > 0:
            self.fabric.schedule(self.fabric.now + overhead, lambda _: conn.message(nbytes, done, spec), None)
        else:
            conn.message(nbytes, done, spec)

    # ---- background flows ----

    def _start_background(self) -> None:
        cfg = self.config
        if cfg.background_load <= 0:
            return
        hosts = list(range(len(self.fabric.hosts)))
        gbps = float(np.mean([h.nic.rate_bytes_per_s * 8 / 1e9 for h in self.fabric.hosts if h.nic is not None]))
        flows = background_flows(
            hosts, cfg.background_load, gbps, cfg.background, cfg.background_duration_s, cfg.seed,
            cfg.priority_classes - 1,
        )  # fmt: skip
        factory = self._transport
        fabric = self.fabric
        for flow in flows:
            sender, receiver = factory(cfg, flow.cls)
            conn = Connection(fabric, flow.src, flow.dst, flow.cls, sender, receiver, fabric.rng.getrandbits(32))

            def done(flow: Flow = flow) -> None:
                self.background_fcts.append((flow, fabric.now - flow.start_s))

            def start(_: None, conn: Connection = conn, flow: Flow = flow, done: Callable[[], None] = done) -> None:
                conn.message(flow.nbytes, done)

            fabric.schedule_timer(flow.start_s, start, None)

    # ---- outputs ----

    def dlcp_stats(self) -> dict[str, Any]:
        """DLCP messages received so far: how many, how many ended at the bound (not complete), elements and
        elements lost, the largest fraction one message lost; with recorded magnitudes, the share of the squared
        gradient norm lost."""
        out: dict[str, Any] = {"messages": 0, "at_bound": 0, "numel": 0, "lost_numel": 0, "max_lost_fraction": 0.0}
        for conn in self.dlcp_connections.values():
            receiver = conn.receiver
            assert isinstance(receiver, DlcpReceiver)
            for numel, lost, ended, _ in receiver.records:
                out["messages"] += 1
                out["at_bound"] += ended == "bound"
                out["numel"] += numel
                out["lost_numel"] += lost
                out["max_lost_fraction"] = max(out["max_lost_fraction"], lost / numel if numel else 0.0)
        return out
