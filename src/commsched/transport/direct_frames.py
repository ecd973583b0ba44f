"""The direct connections' ops and frames (:mod:`commsched.transport.direct`): one op's state, the rank-order
sum, and a bounded read."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import torch

from commsched.errors import RuntimeCommError

#: A frame's header: magic, sequence number of the op, payload bytes (network byte order).
FRAME = struct.Struct("!4sQQ")
MAGIC = b"CSA1"


@dataclass(slots=True, eq=False)
class Op:
    """One collective on the direct connections, from its start to its completion (in start order)."""

    seq: int
    #: the all-reduce's buffer, or the flat buffer a reduce-scatter reads and an all-gather fills
    flat: torch.Tensor
    describe: str
    #: payload bytes of each peer's frame for this op
    frame_bytes: int
    #: the reduce-scatter's result, or the all-gather's own part (None for an all-reduce)
    shard: torch.Tensor | None = None
    kind: str = "all_reduce"
    done: threading.Event = field(default_factory=threading.Event)
    error: RuntimeCommError | None = None
    #: peers whose frame is not yet written whole, plus one while
    #: :meth:`~commsched.transport.direct.DirectCollectives.start` sends; ``sent`` is set once none is left: the sum
    #: may then overwrite the buffer
    unsent: int = 1
    sent: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, error: RuntimeCommError | None = None) -> None:
        """One frame of this op written whole, or failed (the
        :class:`~commsched.transport.tcp_sender.PeerSender` failed the owner already)."""
        with self._lock:
            self.unsent -= 1
            if self.unsent:
                return
        self.sent.set()


def sum_in_rank_order(peers: list[torch.Tensor], rank: int, own: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` = the sum of ``own`` and the ``peers``' parts (in peer rank order) in rank order,
    ``b_0 + b_1 + ... + b_(p-1)``: the same bits on every rank. ``out`` may be ``own``."""
    parts = [*peers[:rank], own, *peers[rank:]]
    if len(parts) == 2:  # one addition, the same bits in either order
        torch.add(parts[0], parts[1], out=out)
        return
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    out.copy_(total)


def read_into(sock: socket.socket, view: memoryview, deadline: float, where: str, limit: float) -> None:
    """Fill ``view`` from ``sock`` by ``deadline``; RuntimeCommError naming ``where`` otherwise."""
    got = 0
    while got < len(view):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise RuntimeCommError(f"{where} sent nothing for {limit:g} s")
        try:
            n = sock.recv_into(view[got:], len(view) - got)
        except OSError as exc:
            raise RuntimeCommError(f"{where}: the connection failed ({exc})") from exc
        if n == 0:
            raise RuntimeCommError(f"{where} closed the connection")
        got += n
