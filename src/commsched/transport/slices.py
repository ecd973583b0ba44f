"""Which rank owns which slice of a task's flat buffer (the parameter server's sharding), without torch.

Used by :mod:`commsched.transport.exchange` (the real push/pull) and by the
packet-level simulator, which sends the same slices between the same ranks.
"""

from __future__ import annotations

from collections.abc import Sequence


def owner_slices(numel: int, world: int, servers: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """``[start, stop)`` of each rank's slice: an even split over ``servers`` (default: every rank), in their
    order, the first ``numel % len(servers)`` one longer; a rank that is no server owns ``(0, 0)``."""
    owners = list(range(world)) if servers is None else list(servers)
    base, extra = divmod(numel, len(owners))
    out, start = [(0, 0)] * world, 0
    for i, r in enumerate(owners):
        stop = start + base + (i < extra)
        out[r] = (start, stop)
        start = stop
    return out
