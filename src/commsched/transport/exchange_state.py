"""The parameter server's state per task pair on one rank, and what each launch lost
(:class:`~commsched.transport.exchange.PsExchange` keeps one :class:`ServerState` per push task)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from commsched.transport.slices import owner_slices

PUSH, PULL = 0, 1
__all__ = ["PULL", "PUSH", "Loss", "ServerState"]


@dataclass(frozen=True, slots=True)
class Loss:
    """What one phase of one launch lost on this rank: ``lost_numel`` of the ``received_numel`` it received.

    ``task``, ``phase`` (:data:`PUSH` or :data:`PULL`) and ``step`` (the task's
    launch count) name the launch; ``missing``: the element ranges ``[start,
    stop)`` of the task's flat buffer that did not arrive (for a push, the
    slice this rank owns: a peer's contribution to them counted as zero);
    ``loss_bound``: the bound each of the phase's receives had.
    """

    step: int
    lost_numel: int
    received_numel: int
    task: int = -1
    phase: int = PUSH
    missing: tuple[tuple[int, int], ...] = ()
    loss_bound: float = 0.0

    @property
    def fraction(self) -> float:
        return self.lost_numel / self.received_numel if self.received_numel else 0.0


class ServerState:
    """One task pair's state on this rank: its slices, its push inboxes as owner, and its latest push's buffer."""

    __slots__ = ("dtype", "flat", "inbox", "numel", "previous", "pushing", "scratch", "slices", "summed")

    def __init__(
        self, numel: int, dtype: torch.dtype, rank: int, world: int, servers: Sequence[int] | None, keep_previous: bool
    ) -> None:
        self.numel, self.dtype = numel, dtype
        self.slices = owner_slices(numel, world, servers)
        lo, hi = self.slices[rank]
        #: a push of this task is under way on this rank (from its start until its sum is made)
        self.pushing = False
        #: the latest push's buffer (its owner's slice holds the sum once made), and the step of the latest push
        #: whose sum was made (-1: none yet)
        self.flat: torch.Tensor | None = None
        self.summed = -1
        #: the partial sum of the lower ranks' contributions, for an owner of rank 2 or above (allocated then)
        self.scratch: torch.Tensor | None = None
        self.inbox = {q: torch.zeros(hi - lo, dtype=dtype) for q in range(world) if q != rank}
        self.previous = torch.zeros(numel, dtype=dtype) if keep_previous else None

    def sum_in_place(self, own: torch.Tensor, rank: int, world: int) -> None:
        """Add the peers' contributions to ``own``, rank ``rank``'s slice, bit for bit the sum in rank order:
        ``b_0 + ... + b_(r-1)`` first (in scratch memory where that is two or more), added to ``own`` (``b_r``;
        addition commutes, so ``b_r + x`` is ``x + b_r``), then ``b_(r+1)``, ... in turn."""
        before = [self.inbox[q] for q in range(rank)]
        if len(before) > 1:
            if self.scratch is None:
                self.scratch = torch.empty_like(own)
            torch.add(before[0], before[1], out=self.scratch)
            for part in before[2:]:
                self.scratch.add_(part)
            own.add_(self.scratch)
        elif before:
            own.add_(before[0])
        for q in range(rank + 1, world):
            own.add_(self.inbox[q])
