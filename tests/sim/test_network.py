from __future__ import annotations

import pytest

from commsched.sim.costs import Phase
from commsched.sim.engine import EventLoop
from commsched.sim.network import Collective, Network, SharedLink


def test_two_equal_transfers_sharing_a_link_both_take_twice_as_long() -> None:
    loop = EventLoop()
    link = SharedLink(loop, "l")
    done: dict[str, float] = {}
    link.add(1.0, lambda: done.__setitem__("a", loop.now))
    link.add(1.0, lambda: done.__setitem__("b", loop.now))
    loop.run()
    assert done == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}


def test_a_late_joiner_slows_the_transfer_in_flight_only_while_both_run() -> None:
    loop = EventLoop()
    link = SharedLink(loop, "l")
    done: dict[str, float] = {}
    link.add(2.0, lambda: done.__setitem__("a", loop.now))
    loop.schedule(1.0, lambda: link.add(0.5, lambda: done.__setitem__("b", loop.now)))
    loop.run()
    # a: 1 s alone, then shares: b needs 0.5 at rate 1/2 (1 s), a gets 0.5 meanwhile, then 0.5 alone
    assert done["b"] == pytest.approx(2.0)
    assert done["a"] == pytest.approx(2.5)
    assert link.busy_within(0.0, 10.0) == pytest.approx(2.5)
    assert link.served_s == pytest.approx(2.5)


def _run(max_concurrent: int) -> list[tuple[float, float]]:
    loop = EventLoop()
    finished: list[Collective] = []
    net = Network(loop, max_concurrent, finished.append)
    for task in range(3):
        net.ready(Collective(task, 0, (Phase(1.0, "ring", 1.0),), 0.0))
    loop.run()
    return [(c.start_s, c.end_s) for c in sorted(finished, key=lambda c: c.task)]


def test_one_channel_serialises_collectives_in_ready_order() -> None:
    assert _run(1) == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]


def test_concurrent_collectives_overlap_latency_and_share_bandwidth() -> None:
    # latencies overlap (all start at 0, transfer from 1 s), 3 transfers of 1 s share the link: all end at 4 s
    spans = _run(3)
    assert [s for s, _ in spans] == [0.0, 0.0, 0.0]
    assert [e for _, e in spans] == [pytest.approx(4.0)] * 3
