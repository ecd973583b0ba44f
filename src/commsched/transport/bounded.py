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

What was lost is reported through :class:`LossReporting` (the runtime's loss
records read any transport that has it): every launch's lost elements, and
cumulative counts of the data datagrams lost on the way, by where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch.distributed as dist

from commsched.transport.base import TransportOptions
from commsched.transport.dlcp import DlcpLink, open_dlcp_link
from commsched.transport.dlcp.kernel import udp_socket_drops
from commsched.transport.exchange import Loss
from commsched.transport.link_exchange import LinkExchange


@dataclass(frozen=True, slots=True)
class DropCounters:
    """Data datagrams of one rank's link lost on the way, cumulative, by where (None: not readable here).

    ``injected``: dropped by the link's emulated loss before they were sent
    (this rank's sends); ``late``: arrived after their receive had ended (the
    receiver stopped waiting for them: the application gave them up);
    ``send_errors``: refused by this rank's own socket (a full send buffer);
    ``socket``: dropped by the kernel at this rank's data sockets (receive
    buffer full), from ``/proc/net/udp``.
    """

    injected: int = 0
    late: int = 0
    send_errors: int = 0
    socket: int | None = None


@runtime_checkable
class LossReporting(Protocol):
    """A transport that may lose part of a transfer and says what."""

    def take_losses(self) -> list[Loss]:
        """Every launch's :class:`~commsched.transport.exchange.Loss` since the last call, oldest first."""
        ...

    def launches(self) -> dict[int, int]:
        """Per task id: launches so far (a launch's ``Loss.step`` counts from here)."""
        ...

    def drop_counters(self) -> DropCounters:
        """Cumulative counts of the datagrams lost on the way on this rank, by where."""
        ...


class DlcpTransport(LinkExchange[DlcpLink]):
    """:class:`~commsched.transport.exchange.PsExchange` over a :class:`DlcpLink`; ``servers``: the ranks that
    own shards (None: all)."""

    __slots__ = ()

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        timeout_s: float,
        options: TransportOptions,
        servers: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(open_dlcp_link(group, timeout_s, options), timeout_s, servers)

    def take_losses(self) -> list[Loss]:
        records = self.exchange.records
        return [records.popleft() for _ in range(len(records))]

    def launches(self) -> dict[int, int]:
        return self.exchange.launches()

    def drop_counters(self) -> DropCounters:
        stats = self.link.stats
        return DropCounters(
            stats.dropped_by_hook, stats.late, stats.send_errors, udp_socket_drops(self.link.data_ports)
        )
