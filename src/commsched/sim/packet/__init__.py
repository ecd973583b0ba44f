"""The packet-level network model (``SimOptions(network="packet")``): queues, priority, ECN, spraying.

:mod:`~commsched.sim.packet.fabric` is the core (ports, routes, its own event
loop); :mod:`~commsched.sim.packet.transport` the clock-free transports
(:data:`TRANSPORTS`); :mod:`~commsched.sim.packet.topology` builds fabrics
from a cluster spec; :mod:`~commsched.sim.packet.model` turns collectives into
traffic and plugs into the simulator.
"""

from commsched.sim.packet.config import PacketConfig, RedParams, TcpParams
from commsched.sim.packet.connection import Connection
from commsched.sim.packet.fabric import Fabric, Packet, Port
from commsched.sim.packet.model import PacketNetwork, packet_factory, packet_network
from commsched.sim.packet.topology import build
from commsched.sim.packet.transport import TRANSPORTS, register_transport

__all__ = [
    "TRANSPORTS",
    "Connection",
    "Fabric",
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
