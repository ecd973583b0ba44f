"""Emulated random loss on a DLCP link: for experiments and tests without a lossy network.

:class:`RandomDrop` is the link's ``drop`` hook: the I/O thread asks it about
every outgoing DATA datagram (first sends and re-sends alike) just before the
datagram would reach the socket, and a datagram it drops is counted
(``LinkStats.dropped_by_hook``) and never sent — to the receiver it is a
datagram the network lost, recovered by PROBE/BITMAP or given up within the
bound. Control messages (STOP, PROBE, BITMAP, ACK) ride TCP and are never
dropped.

This is emulation, not a network: every datagram is lost independently with
the same probability (Bernoulli loss, as netem's ``loss random``), with no
bursts, no queueing and no preference for unimportant packets. A dropped
datagram is never numbered for the rate control, so it emulates loss without
congestion: the sender does not slow down (at 15 % loss the controller would
otherwise settle near its floor of 1 MB/s, since every acknowledgement would
report losses); loss that signals congestion comes from a network that drops
(the testbed's queues). Seeded, so the sequence of decisions is
reproducible; which datagram meets which decision still depends on the
order the I/O thread sends them in, which depends on timing.
"""

from __future__ import annotations

import random

from commsched.transport.base import check_probability


class RandomDrop:
    """Drops each DATA datagram with probability ``fraction``, from a generator seeded by ``(seed, rank)``.

    Called as ``drop(peer, offset) -> bool`` by one I/O thread (not thread-safe).
    """

    __slots__ = ("_rng", "fraction", "seed")

    def __init__(self, fraction: float, seed: int = 0, rank: int = 0) -> None:
        self.fraction = check_probability("inject_loss", fraction)
        self.seed = seed
        self._rng = random.Random(f"commsched.inject/{seed}/{rank}")

    def __call__(self, peer: int, offset: int) -> bool:
        return self._rng.random() < self.fraction
