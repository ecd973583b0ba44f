from __future__ import annotations

import pytest

from commsched.sim.engine import COMM, COMPUTE, EventLoop


def test_events_run_in_time_then_priority_then_insertion_order() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.schedule(2.0, seen.append, "late")
    loop.schedule(1.0, seen.append, "comm", priority=COMM)
    loop.schedule(1.0, seen.append, "compute-a", priority=COMPUTE)
    loop.schedule(1.0, seen.append, "compute-b", priority=COMPUTE)
    loop.run()
    assert seen == ["compute-a", "compute-b", "comm", "late"]
    assert loop.now == 2.0
    assert loop.processed == 4


def test_run_until_stops_before_later_events_and_resumes() -> None:
    loop = EventLoop()
    seen: list[float] = []

    def tick() -> None:
        seen.append(loop.now)
        if loop.now < 5:
            loop.schedule(loop.now + 1.0, tick)

    loop.schedule(0.0, tick)
    loop.run(until=2.0)
    assert seen == [0.0, 1.0, 2.0]
    assert loop.now == 2.0 and loop.peek() == 3.0
    loop.run()
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_scheduling_in_the_past_is_rejected_but_rounding_is_clamped() -> None:
    loop = EventLoop()
    loop.schedule(1.0, lambda: None)
    loop.run()
    with pytest.raises(ValueError, match="clock is already"):
        loop.schedule(0.5, lambda: None)
    loop.schedule(1.0 - 1e-15, lambda: None)
    loop.step()
    assert loop.now == 1.0
