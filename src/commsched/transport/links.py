"""Point-to-point links: the seam between a transport's data flow and its wire.

A parameter server (or a transpose all-reduce) is the same data flow whatever
carries the bytes: each rank sends slices of a task's buffer to the ranks that
own them and receives the sums back. :class:`Link` is what that data flow
needs from the wire: keyed, asynchronous sends and receives between ranks of
one job, in any order. A TCP link delivers every byte (``loss_bound`` 0); a
bounded-loss link (DLCP) may finish a receive with at most ``loss_bound`` of
its elements missing, and says which.

A transfer is addressed by ``(peer, key)``: both sides name the same key, so
transfers of different tasks, phases and iterations may overlap freely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch


class TransferKey(NamedTuple):
    """What a transfer carries: ``task``'s ``phase`` (0 push/reduce, 1 pull/gather) of iteration ``step``."""

    step: int
    task: int
    phase: int


@dataclass(frozen=True, slots=True)
class Received:
    """How a receive ended: ``missing`` element ranges ``[start, stop)`` of ``out`` that were not written."""

    missing: tuple[tuple[int, int], ...] = ()

    @property
    def lost(self) -> int:
        """Elements that did not arrive."""
        return sum(stop - start for start, stop in self.missing)


#: A receive that got every element.
COMPLETE = Received()


class Transfer(Protocol):
    """One pending send or receive."""

    def wait(self, timeout_s: float | None = None) -> Received:
        """Block until done; a send returns :data:`COMPLETE`. Raises RuntimeCommError on failure or timeout."""
        ...

    def is_completed(self) -> bool:
        """True once finished, successfully or not; never blocks."""
        ...

    def then(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` in the thread that finishes the transfer; False (and nothing registered) if it has
        finished already."""
        ...


class Link(Protocol):
    """Keyed point-to-point transfers between the ranks of one job.

    ``data``/``out`` are contiguous 1-D CPU tensors; a send and its matching
    receive have the same number of elements and dtype. ``priority``: the
    layer class of the data (0 = the layer nearest the input, most urgent).
    ``loss_bound``: the largest fraction of the elements the receive may give
    up on (the receiver decides; 0 = every element arrives); a sender that knows its receive's bound may say
    so (``send(..., loss_bound=...)``; None: not known), for a link that marks what may be dropped first.
    """

    rank: int
    world: int

    def send(
        self, peer: int, key: TransferKey, data: torch.Tensor, *, priority: int = 0, loss_bound: float | None = None
    ) -> Transfer: ...

    def recv(self, peer: int, key: TransferKey, out: torch.Tensor, *, loss_bound: float = 0.0) -> Transfer: ...

    def close(self) -> None:
        """Stop the link's threads and close its sockets (bounded by the link's timeout)."""
        ...
