"""The transports the packet network can run, by the name ``PacketConfig.transport`` accepts.

:data:`TRANSPORTS` holds ``tcp`` (NewReno, :mod:`commsched.sim.packet.newreno`),
``dctcp`` and ``pfabric`` (:mod:`commsched.sim.packet.variants`);
:mod:`commsched.sim.packet.dlcp` registers ``dlcp`` with :func:`register_transport`.
"""

from __future__ import annotations

from commsched.sim.packet.config import PacketConfig
from commsched.sim.packet.newreno import TcpReceiver, TcpSender
from commsched.sim.packet.transport import Receiver, Sender, TransportFactory
from commsched.sim.packet.variants import DctcpSender, PfabricSender


def _tcp(config: PacketConfig, cls: int) -> tuple[Sender, Receiver]:
    return TcpSender(config.tcp, cls), TcpReceiver(config.tcp, cls)


def _dctcp(config: PacketConfig, cls: int) -> tuple[Sender, Receiver]:
    return DctcpSender(config.tcp, cls), TcpReceiver(config.tcp, cls, ect=True)


def _pfabric(config: PacketConfig, cls: int) -> tuple[Sender, Receiver]:
    return PfabricSender(config.tcp, cls), TcpReceiver(config.tcp, cls)


#: Transports by the name ``PacketConfig.transport`` accepts.
TRANSPORTS: dict[str, TransportFactory] = {"tcp": _tcp, "dctcp": _dctcp, "pfabric": _pfabric}


def register_transport(name: str, factory: TransportFactory) -> None:
    """Make ``name`` a transport the packet network can run (replacing any earlier registration)."""
    TRANSPORTS[name] = factory
