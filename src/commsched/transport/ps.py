"""The ``"ps"`` transport: a parameter server on every rank, :class:`~commsched.transport.exchange.PsExchange`
over the authenticated TCP mesh of :class:`~commsched.transport.tcp.TcpLink`."""

from __future__ import annotations

import torch.distributed as dist

from commsched.schedule.base import CommTask
from commsched.transport.base import TaskBuffer, TransportOptions
from commsched.transport.exchange import PsExchange
from commsched.transport.handles import Handle
from commsched.transport.tcp import TcpLink


class PsTransport:
    """The ``"ps"`` transport: :class:`~commsched.transport.exchange.PsExchange` over a :class:`TcpLink`.

    Opening is collective over ``group`` (every rank, same order). Lossless:
    TCP delivers every byte, so the push and pull bounds are 0. The servers are
    ``options.servers`` (default: every rank).
    """

    __slots__ = ("exchange", "link")

    def __init__(self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions) -> None:
        self.link = TcpLink(group, timeout_s, options)
        self.exchange = PsExchange(self.link, timeout_s, servers=options.servers)

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        return self.exchange.start(task, buffer)

    def close(self) -> None:
        try:
            self.exchange.close()
        finally:
            self.link.close()
