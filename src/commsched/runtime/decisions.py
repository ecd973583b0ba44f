"""The deciding leader's orders to its followers, over the runtime's own TCP connections.

A completion-driven scheduler (ByteScheduler's and Prophet's credit, the
parameter server's, DLCP's) decides on rank 0; every other rank starts what
rank 0 decided, in its order. The orders are small messages, several per
iteration, and a follower waits for each. They travel on a
:class:`~commsched.transport.tcp.TcpLink` (a star: rank 0 and each
follower; authenticated, bounded by the run's timeout) rather than on a
gloo group, because its sockets take
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

from collections.abc import Callable

import torch
import torch.distributed as dist

from commsched.transport import TransportOptions
from commsched.transport.links import TransferKey
from commsched.transport.tcp import TcpLink, TcpTransfer
from commsched.transport.tcp_mesh import POLL_S

_LENGTH, _VALUES = 0, 1  # the two frames of a message (TransferKey.task)


class DecisionChannel:
    """Rank 0 sends, every other rank receives (collective to open: every rank of ``group``, same order)."""

    __slots__ = ("_link", "_number")

    def __init__(
        self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None
    ) -> None:
        self._link = TcpLink(group, timeout_s, options, star=True)  # only rank 0 talks
        self._number = 0

    def send(self, values: list[int]) -> None:
        """Rank 0: ``values`` to every other rank; returns once handed to the sockets (raises RuntimeCommError)."""
        body = torch.tensor(values, dtype=torch.long)
        length = torch.tensor([body.numel()], dtype=torch.long)
        sent = []
        for peer in sorted(self._link.peers):  # rank 0's: every follower
            sent.append(self._link.send(peer, TransferKey(self._number, _LENGTH, 0), length))
            sent.append(self._link.send(peer, TransferKey(self._number, _VALUES, 0), body))
        self._number += 1
        for transfer in sent:
            transfer.wait()

    def receive(self, stop: Callable[[], bool] = lambda: False) -> list[int] | None:
        """A follower: rank 0's next message, however long it takes (a plan whose leader does not decide
        sends none; a hung leader is caught by the training thread's own bounded waits); None once ``stop()``
        (looked at every :data:`~commsched.transport.tcp_mesh.POLL_S`). Raises RuntimeCommError when the
        leader's connection fails."""
        length = torch.zeros(1, dtype=torch.long)
        if not self._arrived(self._link.recv(0, TransferKey(self._number, _LENGTH, 0), length), stop):
            return None
        body = torch.zeros(int(length.item()), dtype=torch.long)
        if not self._arrived(self._link.recv(0, TransferKey(self._number, _VALUES, 0), body), stop):
            return None
        self._number += 1
        return list(body.tolist())

    @staticmethod
    def _arrived(transfer: TcpTransfer, stop: Callable[[], bool]) -> bool:
        while not transfer.settle(POLL_S):
            if stop():
                return False
        transfer.wait()  # raises the transfer's error, if any
        return True

    def close(self, bound_s: float | None = None) -> None:
        """Send what is queued, then close (bounded by ``bound_s``, default the timeout)."""
        self._link.close(bound_s)
