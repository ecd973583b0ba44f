"""The ``"ps"`` transport: a parameter server on every rank, :class:`~commsched.transport.exchange.PsExchange`
over the authenticated TCP mesh of :class:`~commsched.transport.tcp.TcpLink`."""

from __future__ import annotations

import torch.distributed as dist

from commsched.transport.base import TransportOptions
from commsched.transport.link_exchange import LinkExchange
from commsched.transport.tcp import TcpLink


class PsTransport(LinkExchange[TcpLink]):
    """The ``"ps"`` transport: :class:`~commsched.transport.exchange.PsExchange` over a :class:`TcpLink`.

    Opening is collective over ``group`` (every rank, same order). Lossless:
    TCP delivers every byte, so the push and pull bounds are 0. The servers are
    ``options.servers`` (default: every rank).
    """

    __slots__ = ()

    def __init__(self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions) -> None:
        super().__init__(TcpLink(group, timeout_s, options), timeout_s, options.servers)
        self.link.landing = self.exchange.landing  # a push that arrives before its receive lands in its inbox
