"""The packet-level network model (``SimOptions(network="packet")``): queues, priority, ECN, spraying.

:mod:`~commsched.sim.packet.fabric` is the core (ports, routes, its own event
loop); :mod:`~commsched.sim.packet.transport` the clock-free transports
(:data:`TRANSPORTS`; :mod:`~commsched.sim.packet.dlcp` registers DLCP's, which drives the
real link's state machines); :mod:`~commsched.sim.packet.topology` builds fabrics
from a cluster spec; :mod:`~commsched.sim.packet.model` turns collectives into
traffic and plugs into the simulator. The core can be compiled with mypyc,
together with DLCP's state machines (:mod:`~commsched.sim.packet.compile`,
:mod:`commsched._compiled`); :data:`COMPILED` says whether it is.
"""

from commsched import _compiled

_STALE = _compiled.use_sources_if_stale()  # before any module of the package is imported

#: Whether the core runs compiled (``python -m commsched.sim.packet.compile``), DLCP's state machines with it.
COMPILED = _compiled.compiled() and not _STALE

from commsched.sim.packet import dlcp as _dlcp  # noqa: E402, F401  (registers the "dlcp" transport)
from commsched.sim.packet.config import PacketConfig, RedParams, TcpParams  # noqa: E402
from commsched.sim.packet.connection import Connection  # noqa: E402
from commsched.sim.packet.fabric import Fabric, Packet  # noqa: E402
from commsched.sim.packet.model import PacketNetwork, packet_factory, packet_network  # noqa: E402
from commsched.sim.packet.port import Port  # noqa: E402
from commsched.sim.packet.registry import TRANSPORTS, register_transport  # noqa: E402
from commsched.sim.packet.topology import build  # noqa: E402
from commsched.sim.packet.transport import MessageSpec  # noqa: E402

__all__ = [
    "COMPILED",
    "TRANSPORTS",
    "Connection",
    "Fabric",
    "MessageSpec",
    "Packet",
    "PacketConfig",
    "PacketNetwork",
    "Port",
    "RedParams",
    "TcpParams",
    "build",
    "packet_factory",
    "packet_network",
    "register_transport",
]
