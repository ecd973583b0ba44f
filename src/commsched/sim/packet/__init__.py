"""The packet-level network model (``SimOptions(network="packet")``): queues, priority, ECN, spraying.

:mod:`~commsched.sim.packet.fabric` is the core (ports, routes, its own event
loop); :mod:`~commsched.sim.packet.transport` the clock-free transports
(:data:`TRANSPORTS`; :mod:`~commsched.sim.packet.dlcp` registers DLCP's, which drives the
real link's state machines); :mod:`~commsched.sim.packet.topology` builds fabrics
from a cluster spec; :mod:`~commsched.sim.packet.model` turns collectives into
traffic and plugs into the simulator. The core can be compiled with mypyc
(:mod:`~commsched.sim.packet.compile`); :data:`COMPILED` says whether it is.
"""

import importlib.util
import sys
import warnings

from commsched.sim.packet import _core as _compile

_STALE = _compile.stale()
if _STALE:  # compiled modules older than their sources: run the sources
    warnings.warn(
        f"commsched.sim.packet: compiled {', '.join(_STALE)} out of date with the source; running pure Python "
        "(recompile: python -m commsched.sim.packet.compile)",
        stacklevel=2,
    )
    for _name in _compile.MODULES:
        _full = f"commsched.sim.packet.{_name}"
        _spec = importlib.util.spec_from_file_location(_full, _compile.HERE / f"{_name}.py")
        assert _spec is not None and _spec.loader is not None
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_full] = _module
        _spec.loader.exec_module(_module)

#: Whether the core runs compiled (``python -m commsched.sim.packet.compile``).
COMPILED = _compile.compiled() and not _STALE

from commsched.sim.packet import dlcp as _dlcp  # noqa: E402, F401  (registers the "dlcp" transport)
from commsched.sim.packet.config import PacketConfig, RedParams, TcpParams  # noqa: E402
from commsched.sim.packet.connection import Connection  # noqa: E402
from commsched.sim.packet.fabric import Fabric, Packet, Port  # noqa: E402
from commsched.sim.packet.model import PacketNetwork, packet_factory, packet_network  # noqa: E402
from commsched.sim.packet.topology import build  # noqa: E402
from commsched.sim.packet.transport import TRANSPORTS, MessageSpec, register_transport  # noqa: E402

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
