"""The deciding leader's orders to its followers, over the runtime's own TCP connections.

A completion-driven scheduler (ByteScheduler's and Prophet's credit, the
parameter server's, DLCP's) decides on rank 0; every other rank starts what
rank 0 decided, in its order. The orders are small messages, several per
iteration, and a follower waits for each. They travel on a
:class:`~commsched.transport.tcp.TcpLink` (authenticated, bounded by the
run's timeout) rather than on a gloo group, because its sockets take
:func:`~commsched.transport.tcp_options.tune_for_cluster`'s timers: a lost
segment at the end of a small message otherwise waits out Linux's 200 ms
minimum retransmission timeout, and on a lossy network that stalled the
followers, and with them the leader's next collective, in most iterations
(docs/dlcp.md, "Small messages under loss").

A message is a list of integers, sent as two frames (its length, then the
values) keyed by its number, so a follower posts receives of the right size
in order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from commsched.transport import TransportOptions
from commsched.transport.links import TransferKey
from commsched.transport.tcp import TcpLink

_LENGTH, _VALUES = 0, 1  # the two frames of a message (TransferKey.task)


class DecisionChannel:
    """Rank 0 sends, every other rank receives (collective to open: every rank of ``group``, same order)."""

    __slots__ = ("_link", "_number", "rank", "world")

    def __init__(
        self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None
    ) -> None:
        self._link = TcpLink(group, timeout_s, options)
        self.rank, self.world = self._link.rank, self._link.world
        self._number = 0

    def send(self, values: list[int]) -> None:
        """Rank 0: ``values`` to every other rank; returns once handed to the sockets (raises RuntimeCommError)."""
        body = torch.tensor(values, dtype=torch.long)
        length = torch.tensor([body.numel()], dtype=torch.long)
        sent = []
        for peer in range(1, self.world):
            sent.append(self._link.send(peer, TransferKey(self._number, _LENGTH, 0), length))
            sent.append(self._link.send(peer, TransferKey(self._number, _VALUES, 0), body))
        self._number += 1
        for transfer in sent:
            transfer.wait()

    def receive(self) -> list[int]:
        """A follower: rank 0's next message (raises RuntimeCommError when it does not come within the timeout)."""
        length = torch.zeros(1, dtype=torch.long)
        self._link.recv(0, TransferKey(self._number, _LENGTH, 0), length).wait()
        body = torch.zeros(int(length.item()), dtype=torch.long)
        self._link.recv(0, TransferKey(self._number, _VALUES, 0), body).wait()
        self._number += 1
        return list(body.tolist())

    def close(self) -> None:
        """Send what is queued, then close (bounded by the timeout)."""
        self._link.close()
