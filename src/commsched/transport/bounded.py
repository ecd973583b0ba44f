"""The ``"dlcp"`` and ``"dlcp_ps"`` transports: the parameter server's data flow over DLCP datagrams.

:class:`~commsched.transport.exchange.PsExchange` over a
:class:`~commsched.transport.dlcp.DlcpLink`: the same push/pull as the
lossless ``"ps"`` transport, with each receive allowed to finish at its
bound (a push at ``task.loss_bound``, a pull at its own bound; missing
gradient entries count as zeros, missing entries of a pulled sum keep the
previous iteration's value).

* ``"dlcp"``: every rank owns a shard of each task (a transpose all-reduce);
* ``"dlcp_ps"``: rank 0 is the one server (DLCP's parameter-server setting).

Registered in :data:`commsched.transport.TRANSPORTS`. Opening is collective
over the runtime's group (every rank, same order). CPU tensors only, as the
parameter server.
"""

from __future__ import annotations

import torch.distributed as dist

from commsched.schedule.base import CommTask
from commsched.transport.base import TaskBuffer, TransportOptions
from commsched.transport.collectives import Handle
from commsched.transport.dlcp import DlcpLink, open_dlcp_link
from commsched.transport.exchange import PsExchange


class DlcpTransport:
    """:class:`PsExchange` over a :class:`DlcpLink`; ``servers``: the ranks that own shards (None: all)."""

    __slots__ = ("exchange", "link")

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        timeout_s: float,
        options: TransportOptions,
        servers: tuple[int, ...] | None = None,
    ) -> None:
        self.link: DlcpLink = open_dlcp_link(group, timeout_s, options)
        try:
            self.exchange = PsExchange(self.link, timeout_s, servers=servers)
        except BaseException:
            self.link.close()
            raise

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        return self.exchange.start(task, buffer)

    def close(self) -> None:
        try:
            self.exchange.close()
        finally:
            self.link.close()
