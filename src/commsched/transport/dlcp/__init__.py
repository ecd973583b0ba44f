"""DLCP: bounded-loss transport for gradients (DLCP, arXiv 2008.08445; MLT, NSDI'24).

A receive may finish with at most ``floor(loss_bound · numel)`` elements
missing, and says which: the receiver counts what arrived and STOPs the
sender at the bound; before that, the sender PROBEs when it has sent
everything and re-sends the holes the receiver's BITMAP names. Packets are
self-describing, MAC'd, offset-addressed datagrams, so they can be written
in any order and sprayed over every path; important ones (large chunks,
urgent layers) go first, ECN-capable, at a higher DSCP class.

- :mod:`~commsched.transport.dlcp.wire`: the datagram format and its checks.
- :mod:`~commsched.transport.dlcp.protocol` and
  :mod:`~commsched.transport.dlcp.sender`: the clock-free receiver and
  sender state machines, importance and TOS marking (what the packet-level
  simulator drives too).
- :mod:`~commsched.transport.dlcp.rate`: the sender's ECN/loss rate control.
- :mod:`~commsched.transport.dlcp.link`: :class:`DlcpLink`, the
  :class:`~commsched.transport.links.Link` over UDP (data) and TCP (control),
  and :func:`open_dlcp_link` over a gloo group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from commsched import _compiled
from commsched._lazy import lazy_getattr

_compiled.use_sources_if_stale()  # the state machines may run compiled: from source if out of date

if TYPE_CHECKING:
    from commsched.transport.dlcp.link import DlcpLink, DlcpTransfer, open_dlcp_link
    from commsched.transport.dlcp.protocol import ReceiverState, classify, tos_byte
    from commsched.transport.dlcp.rate import RateControl, RateParams
    from commsched.transport.dlcp.sender import SenderState
    from commsched.transport.dlcp.slots import LinkStats, TransferRecord
    from commsched.transport.dlcp.sockets import Endpoints, LinkSockets
    from commsched.transport.dlcp.wire import Codec, Datagram, Kind

#: Where each public name lives, imported on first use (PEP 562): the state machines (``protocol``,
#: ``sender``, ``rate``) need neither torch nor sockets, and the packet-level simulator imports them alone.
_HOMES = {
    "DlcpLink": "link",
    "DlcpTransfer": "link",
    "open_dlcp_link": "link",
    "ReceiverState": "protocol",
    "SenderState": "sender",
    "classify": "protocol",
    "tos_byte": "protocol",
    "RateControl": "rate",
    "RateParams": "rate",
    "LinkStats": "slots",
    "TransferRecord": "slots",
    "Endpoints": "sockets",
    "LinkSockets": "sockets",
    "Codec": "wire",
    "Datagram": "wire",
    "Kind": "wire",
}


__getattr__ = lazy_getattr(__name__, _HOMES)


__all__ = [
    "Codec",
    "Datagram",
    "DlcpLink",
    "DlcpTransfer",
    "Endpoints",
    "Kind",
    "LinkSockets",
    "LinkStats",
    "RateControl",
    "RateParams",
    "ReceiverState",
    "SenderState",
    "TransferRecord",
    "classify",
    "open_dlcp_link",
    "tos_byte",
]
