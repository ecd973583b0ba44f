"""One training simulation on the packet-level network with a given :class:`PacketConfig`.

``simulate(..., options={"network": "packet"})`` runs the default
``PacketConfig``; :func:`simulate_packet` runs any, and returns the network
too, for its per-connection statistics and queue-depth counters. Kept out of
the package's ``__init__`` because it imports the simulator, which imports
the package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import ScheduleError
from commsched.sim.network import NetworkContext
from commsched.sim.options import SimOptions
from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.model import PacketNetwork, packet_factory
from commsched.sim.result import SimResult
from commsched.sim.simulator import plan_for, simulate_plan
from commsched.workload import Workload


@dataclass(frozen=True)
class PacketRun:
    """What :func:`simulate_packet` returns: the simulator's result and the packet network it ran on."""

    result: SimResult
    network: PacketNetwork

    def save_chrome(self, path: str | Path) -> None:
        """The Trace as Chrome JSON, plus queue-depth counters (``record_queues=true``) and connection stats."""
        assert self.result.trace is not None, "simulated with trace=False"
        self.network.save_chrome(self.result.trace, path)


def simulate_packet(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    config: PacketConfig,
    iterations: int = 20,
    warmup: int = 3,
    *,
    options: SimOptions | Mapping[str, Any] | None = None,
    trace: bool = True,
    on_network: Callable[[PacketNetwork], None] | None = None,
    **knobs: Any,
) -> PacketRun:
    """``simulate(workload, cluster, policy, ...)`` on the packet network ``config`` describes.

    Same plan, scheduler and measurements as :func:`commsched.sim.simulate`;
    ``options.network`` must be ``packet`` (the default here). Raises
    ScheduleError where ``simulate`` does, and for a config the cluster
    cannot take (the ``ps`` algorithm without servers). ``on_network`` is
    called with the packet network once it is built, before it runs (for a
    caller that reports progress from its ``fabric``: ``now``, ``processed``).
    """
    sim_options = SimOptions.from_mapping({"network": "packet", **_as_dict(options)})
    if sim_options.network != "packet":
        raise ScheduleError(f"sim: a packet config needs network=packet, got network={sim_options.network!r}")
    plan = plan_for(workload, cluster, policy, sim_options, **knobs)
    made: list[PacketNetwork] = []

    def network(context: NetworkContext) -> PacketNetwork:
        made.append(packet_factory(config)(context))
        if on_network is not None:
            on_network(made[-1])
        return made[-1]

    result = simulate_plan(plan, cluster, iterations, warmup, options=sim_options, trace=trace, network=network)
    return PacketRun(result, made[0])


def _as_dict(options: SimOptions | Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, SimOptions):
        return asdict(options)
    return dict(options)
