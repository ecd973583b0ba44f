"""The leader's decisions reach every follower whole and in order, on connections (rank 0 to each follower
only) with the cluster timers."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from commsched.errors import RuntimeCommError
from commsched.runtime.agent import Agent
from commsched.transport.tcp_options import RTO_MIN_US, tune_for_cluster

import _workers as W
from conftest import spawn

pytestmark = pytest.mark.multiproc


def test_every_follower_receives_every_decision_in_order_on_tuned_connections(tmp_path: Path) -> None:
    with socket.socket() as probe:
        supported = tune_for_cluster(probe)
    count = 200
    results = spawn(W.decisions, 3, tmp_path, count, timeout_s=120)
    for rank, r in enumerate(results):
        assert "error" not in r and "missing" not in r, (rank, r)
        if rank:
            assert r["got"] == [[n, *range(n % 7)] for n in range(count)], rank
        # every connection of the channel took the floor where the kernel reads the option at all (Linux 6.15+)
        assert all(RTO_MIN_US <= f <= 4 * RTO_MIN_US for f in r["floors"]), r["floors"]
        # a star: rank 0 dials each follower, a follower accepts rank 0 only
        assert len(r["floors"]) == ((2 if rank == 0 else 1) if supported else 0), (rank, r["floors"])


#: how rank 0 breaks the stream, what the follower's error says, and how the follower reads
BROKEN = [
    ("garbage", "malformed frame (magic 0xffffffff", "receive"),
    ("too_long", "malformed frame", "receive"),
    ("close", "closed", "receive"),
    ("garbage", "malformed frame (magic 0xffffffff", "poll"),
    ("close", "closed", "poll"),
]


@pytest.fixture(scope="module")
def broken_streams(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every case of :data:`BROKEN` in turn, each on a channel of its own, in one pair of processes."""
    cases = [(how, read) for how, _, read in BROKEN]
    return spawn(W.decisions_broken, 2, tmp_path_factory.mktemp("broken"), cases, timeout_s=120)


@pytest.mark.parametrize(("how", "says", "read"), BROKEN)
def test_a_follower_raises_when_the_leaders_stream_breaks(
    broken_streams: list[dict], how: str, says: str, read: str
) -> None:
    """What cannot be read ends the follower with a clear error, after the messages before it arrived whole,
    whether its thread waits for them or its training thread polls."""
    leader, follower = (r.get(f"{how}-{read}", r) for r in broken_streams)
    assert "error" not in leader, leader
    assert follower.get("got") == [7, 8, 9], follower
    assert "next" not in follower and says in follower.get("raised", ""), follower


def test_strangers_at_the_followers_listener_are_rejected_and_rank_0_still_connects(tmp_path: Path) -> None:
    results = spawn(W.decisions_strangers, 2, tmp_path, timeout_s=60)
    assert "error" not in results[0], results[0]
    assert results[1] == {"got": [1, 2, 3], "rejected": 2}, results[1]


def test_the_leader_never_blocks_on_a_follower_that_does_not_read(tmp_path: Path) -> None:
    """32 MiB of orders to a follower that reads nothing until the last is offered: the offers return (else
    the follower's barrier never comes and the run times out), the socket kept part of them for the sender,
    and the follower still reads every message in order, the one offered after the drain last."""
    count = 1024  # 32 KiB each: far more than a socket's buffers hold
    results = spawn(W.decisions_backlog, 2, tmp_path, count, timeout_s=120)
    leader, follower = results
    assert "error" not in leader and "error" not in follower, results
    first_kept, last_kept = leader["kept"]
    assert 0 < first_kept < count and last_kept, leader  # the first offers went straight out, the later were kept
    assert leader["drained"], leader
    assert follower == {"in_order": True, "last": [count]}, follower


def test_the_training_thread_polls_the_orders_without_blocking_and_one_reader_reads_at_a_time(tmp_path: Path) -> None:
    results = spawn(W.decisions_poll, 2, tmp_path, 300, timeout_s=60)
    leader, follower = results
    assert "error" not in leader and "error" not in follower, results
    assert follower["in_order"], follower
    assert follower["empty"] == [] and follower["empty_s"] < 0.1, follower  # not the receive's 0.5 s poll
    assert follower["while_reading"] == [], follower
    assert follower["reader_got"] == [[300]], follower


class _ClosedAfterStop:
    """A follower's channel whose leader sent its stop order and closed: reading past that order fails."""

    def __init__(self) -> None:
        self.receives = 0

    def receive(self, stop: object = None) -> list[int] | None:
        self.receives += 1
        raise RuntimeCommError("rank 1: rank 0 closed its decision connection")

    def poll(self) -> list[list[int]]:
        self.receives += 1
        raise RuntimeCommError("rank 1: rank 0 closed its decision connection")

    def close(self, bound_s: float | None = None) -> None:
        pass


def test_the_follow_thread_does_not_read_past_a_stop_order_the_training_thread_took() -> None:
    """The race a suite run hit once: the training thread holds the orders' lock and reads the leader's stop
    order while the follow thread waits for that lock; the leader has closed its connection by then, and a
    follow thread that read on reported the close as a failure (in the next flush of the follower)."""
    agent = Agent(1, 2, lambda name: None, lambda: None, 30.0, None, 0.0)  # type: ignore[arg-type,return-value]
    channel = _ClosedAfterStop()
    agent._decisions = channel  # type: ignore[assignment]
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            agent._follow_loop()
        except BaseException as exc:
            errors.append(exc)

    with agent._orders:  # the training thread, reading the orders
        thread = threading.Thread(target=follow)
        thread.start()
        time.sleep(0.2)  # the follow thread has checked the flags and waits for the lock
        assert thread.is_alive()
        assert agent._follow([1, -1, -1, -1]) is False  # the stop order
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert errors == [] and channel.receives == 0, errors


def test_the_training_thread_does_not_read_past_a_stop_order_the_follow_thread_took() -> None:
    """The same race the other way: the training thread saw ``_follows`` set, then the follow thread read the stop
    order and released the lock before the training thread took it."""
    agent = Agent(1, 2, lambda name: None, lambda: None, 30.0, None, 0.0)  # type: ignore[arg-type,return-value]
    channel = _ClosedAfterStop()
    agent._decisions = channel  # type: ignore[assignment]
    with agent._orders:  # the follow thread, reading the stop order
        assert agent._follow([1, -1, -1, -1]) is False
    agent._take_orders()  # the training thread, past its check of ``_follows``
    agent.completions.raise_if_failed()
    assert channel.receives == 0
