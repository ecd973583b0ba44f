"""The parameter server's data flow (PsExchange) over DlcpLinks: three ranks in one process on 127.0.0.1."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from commsched.schedule.base import CommTask, Segment
from commsched.transport import TaskBuffer
from commsched.transport.dlcp import DlcpLink, LinkSockets
from commsched.transport.exchange import PULL, PUSH, PsExchange

KEY = bytes(range(32))
TIMEOUT_S = 20.0


def task(task_id: int, kind: str, numel: int, deps: tuple[int, ...] = (), loss_bound: float = 0.0) -> CommTask:
    return CommTask(task_id, kind, (Segment(0, 0, numel),), 4 * numel, f"t{task_id}", 0, deps, "dlcp", loss_bound)  # type: ignore[arg-type]


def mesh(world: int, drop: Callable[[int, int], bool] | None = None) -> list[DlcpLink]:
    sockets = [LinkSockets("127.0.0.1") for _ in range(world)]
    peers = [s.endpoints for s in sockets]
    return [DlcpLink(r, world, sockets[r], peers, KEY, timeout_s=TIMEOUT_S, drop=drop) for r in range(world)]


def test_push_and_pull_leave_the_exact_sum_on_every_rank_over_several_steps() -> None:
    world, numel = 3, 100_001
    links = mesh(world)
    xs = [PsExchange(link, TIMEOUT_S) for link in links]
    try:
        for step in range(3):
            flats = [torch.randn(numel, generator=torch.Generator().manual_seed(10 * step + r)) for r in range(world)]
            expected = flats[0] + flats[1] + flats[2]  # each owner sums in rank order
            for kind, tid in (("push", 0), ("pull", 1)):
                t = task(tid, kind, numel, deps=(0,) if kind == "pull" else ())
                handles = [x.start(t, TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
                for h in handles:
                    h.wait(TIMEOUT_S)
            for f in flats:
                assert torch.equal(f, expected)
    finally:
        for x in xs:
            x.close()
        for link in links:
            link.close()


def test_a_lossy_push_stays_within_its_bound() -> None:
    world, numel, bound = 3, 200_000, 0.05
    rng = random.Random(2)
    links = mesh(world, drop=lambda _peer, _offset: rng.random() < 0.1)
    xs = [PsExchange(link, TIMEOUT_S) for link in links]
    try:
        flats = [torch.full((numel,), float(r + 1)) for r in range(world)]
        push, pull = task(0, "push", numel, loss_bound=bound), task(1, "pull", numel, deps=(0,))
        for t in (push, pull):
            handles = [x.start(t, TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
            for h in handles:
                h.wait(TIMEOUT_S)
        for x in xs:
            loss = x.losses[(0, PUSH)]
            assert loss.lost_numel <= bound * loss.received_numel
            assert x.losses[(1, PULL)].lost_numel == 0
        lost = sum(x.losses[(0, PUSH)].lost_numel for x in xs)
        assert lost > 0  # the bound was used: the push did not wait for every re-send
        for f in flats:  # a lost contribution counts as zero (a peer's 1, 2 or 3); the pull was lossless
            assert torch.equal(f, flats[0])
            assert bool(((f >= 1) & (f <= 6)).all()) and float(f.sum()) >= 6 * numel - 3 * lost
    finally:
        for x in xs:
            x.close()
        for link in links:
            link.close()
