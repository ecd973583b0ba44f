"""The parameter server's data flow over an in-memory link: every rank an exchange in one process, threads.

The fake link delivers each send after a random delay (so transfers complete
in mixed order) and can lose chosen ranges of chosen transfers, reporting
them as ``Received.missing`` as a bounded-loss link would; lost elements are
written as NaN, so a range the exchange forgot to fill shows.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import pytest
import torch

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.schedule.base import CommTask, Segment
from commsched.transport import TaskBuffer
from commsched.transport.exchange import PULL, PUSH, PsExchange, owner_slices
from commsched.transport.exchange_tasks import Chained
from commsched.transport.handles import Ended
from commsched.transport.links import COMPLETE, Received, TransferKey

TIMEOUT_S = 10.0


class FakeTransfer:
    def __init__(self) -> None:
        self.done = Ended()
        self.received = COMPLETE
        self.error: RuntimeCommError | None = None

    def finish(self, received: Received = COMPLETE, error: RuntimeCommError | None = None) -> None:
        self.received, self.error = received, error
        self.done.set()

    def then(self, fn: Callable[[], None]) -> bool:
        return self.done.then(fn)

    def wait(self, timeout_s: float | None = None) -> Received:
        if not self.done.wait(timeout_s):
            raise RuntimeCommError(f"fake transfer did not complete within {timeout_s} s")
        if self.error is not None:
            raise self.error
        return self.received

    def is_completed(self) -> bool:
        return self.done.is_set()


class DetachableTransfer(FakeTransfer):
    """A send that can go on without its caller's tensor, as DLCP's (the fake's already read a copy)."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.detached = False
        self.refuse = refuse

    def detach(self) -> bool:
        self.detached = not self.refuse
        return self.detached


class FakeNetwork:
    """Matches sends to receives by ``(src, dst, key)``; ``lose[(src, dst, phase)]`` = ranges to drop."""

    def __init__(self, world: int, max_delay_s: float = 0.0, seed: int = 0) -> None:
        self.world = world
        self.max_delay_s = max_delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.arrived: dict[tuple[int, int, TransferKey], torch.Tensor] = {}
        self.posted: dict[tuple[int, int, TransferKey], tuple[torch.Tensor, FakeTransfer]] = {}
        self.lose: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.timers: list[threading.Timer] = []
        #: sends kept unended until the test ends them (a bounded-loss link ends a send at the receiver's Stop)
        self.held: list[FakeTransfer] | None = None
        #: sends are :class:`DetachableTransfer`; ``refuse``: whose ``detach`` says it cannot now
        self.detachable = False
        self.refuse = False
        #: per transfer ``(src, dst, key)``: the loss bound its send was given and its receive's
        self.send_bounds: dict[tuple[int, int, TransferKey], float | None] = {}
        self.recv_bounds: dict[tuple[int, int, TransferKey], float] = {}
        self.links = [FakeLink(self, r) for r in range(world)]

    def deliver(self, where: tuple[int, int, TransferKey], data: torch.Tensor) -> None:
        with self.lock:
            posted = self.posted.pop(where, None)
            if posted is None:
                self.arrived[where] = data
                return
        self._write(where, data, *posted)

    def post(self, where: tuple[int, int, TransferKey], out: torch.Tensor, transfer: FakeTransfer) -> None:
        with self.lock:
            data = self.arrived.pop(where, None)
            if data is None:
                self.posted[where] = (out, transfer)
                return
        self._write(where, data, out, transfer)

    def _write(self, where: tuple[int, int, TransferKey], data: torch.Tensor, out: torch.Tensor, t: FakeTransfer):
        src, dst, key = where
        assert data.numel() == out.numel() and data.dtype == out.dtype
        out.copy_(data)
        missing = tuple(self.lose.get((src, dst, key.phase), ()))
        for a, b in missing:
            out[a:b] = float("nan")
        t.finish(Received(missing))


class FakeLink:
    def __init__(self, net: FakeNetwork, rank: int) -> None:
        self.net, self.rank, self.world = net, rank, net.world

    def send(
        self, peer: int, key: TransferKey, data: torch.Tensor, *, priority: int = 0, loss_bound: float | None = None
    ) -> FakeTransfer:
        self.net.send_bounds[(self.rank, peer, key)] = loss_bound
        copy = data.clone()  # what the wire carries: read at send time
        delay = self.net.rng.uniform(0, self.net.max_delay_s)
        timer = threading.Timer(delay, self.net.deliver, args=((self.rank, peer, key), copy))
        self.net.timers.append(timer)
        timer.start()
        t = DetachableTransfer(self.net.refuse) if self.net.detachable else FakeTransfer()
        if self.net.held is None:
            t.finish()
        else:
            self.net.held.append(t)
        return t

    def recv(self, peer: int, key: TransferKey, out: torch.Tensor, *, loss_bound: float = 0.0) -> FakeTransfer:
        self.net.recv_bounds[(peer, self.rank, key)] = loss_bound
        t = FakeTransfer()
        self.net.post((peer, self.rank, key), out, t)
        return t

    def close(self) -> None:
        pass


def task(task_id: int, kind: str, numel: int, deps: tuple[int, ...] = (), loss_bound: float = 0.0) -> CommTask:
    return CommTask(task_id, kind, (Segment(0, 0, numel),), 4 * numel, f"t{task_id}", 0, deps, "ps", loss_bound)  # type: ignore[arg-type]


def exchanges(net: FakeNetwork, **kw: object) -> list[PsExchange]:
    return [PsExchange(link, TIMEOUT_S, **kw) for link in net.links]  # type: ignore[arg-type]


def push_pull(xs: Sequence[PsExchange], push: CommTask, pull: CommTask, flats: Sequence[torch.Tensor]) -> None:
    """Every rank pushes, waits, then pulls (the runtime's order for one pair)."""
    handles = [x.start(push, TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    for h in handles:
        h.wait(TIMEOUT_S)
    handles = [x.start(pull, TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    for h in handles:
        h.wait(TIMEOUT_S)
        assert h.is_completed()


def rank_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    out = tensors[0].clone()
    for t in tensors[1:]:
        out += t
    return out


def test_owner_slices_split_evenly_with_the_remainder_on_the_first_ranks() -> None:
    assert owner_slices(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert owner_slices(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert owner_slices(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]  # a padded buffer: the collective's chunks
    assert owner_slices(5, 3, servers=(2, 0)) == [(3, 5), (0, 0), (0, 3)]  # servers in the order given


@pytest.mark.parametrize("servers", [(0,), (2, 0)])
def test_fewer_servers_than_ranks_still_leave_the_sum_on_every_rank(servers: tuple[int, ...]) -> None:
    world, n = 3, 11
    net = FakeNetwork(world, max_delay_s=0.002)
    xs = exchanges(net, servers=servers)
    flats = [torch.arange(n, dtype=torch.float64) * (r + 1) for r in range(world)]
    push_pull(xs, task(0, "push", n), task(1, "pull", n, deps=(0,)), flats)
    for f in flats:
        assert torch.equal(f, torch.arange(n, dtype=torch.float64) * 6)
    assert xs[1].losses[(0, PUSH)].received_numel == 0  # rank 1 serves nothing
    assert xs[servers[0]].losses[(0, PUSH)].received_numel == (world - 1) * (n if len(servers) == 1 else 6)


@pytest.mark.parametrize("world", [2, 3])
def test_a_pull_into_another_buffer_than_its_push_still_receives_the_sum(world: int) -> None:
    n = 7
    net = FakeNetwork(world, max_delay_s=0.002)
    xs = exchanges(net)
    pushed = [torch.arange(n, dtype=torch.float64) + 10 * r for r in range(world)]
    expected = rank_sum(pushed)
    push, pull = task(0, "push", n), task(1, "pull", n, deps=(0,))
    for h in [x.start(push, TaskBuffer(f)) for x, f in zip(xs, pushed, strict=True)]:
        h.wait(TIMEOUT_S)
    pulled = [torch.full((n,), float("nan"), dtype=torch.float64) for _ in range(world)]
    for h in [x.start(pull, TaskBuffer(f)) for x, f in zip(xs, pulled, strict=True)]:
        h.wait(TIMEOUT_S)
    for f in pulled:
        assert torch.equal(f, expected)


def test_a_frame_may_land_in_place_only_between_the_sum_it_follows_and_the_start_of_its_receive() -> None:
    world, n = 2, 6  # rank 0 owns [0, 3): its inbox from rank 1 holds 3 elements
    net = FakeNetwork(world)
    xs = exchanges(net)
    push, pull = task(0, "push", n), task(1, "pull", n, deps=(0,))
    x = xs[0]
    assert x.landing(1, TransferKey(0, 0, PUSH), torch.float32, 3) is None  # a task it never started
    push_pull(xs, push, pull, [torch.ones(n), torch.ones(n)])
    box = x.landing(1, TransferKey(1, 0, PUSH), torch.float32, 3)  # the next step's push, its sum made
    assert box is not None and box.data_ptr() == x._servers[0].inbox[1].data_ptr()
    assert x.landing(1, TransferKey(0, 0, PUSH), torch.float32, 3) is None  # a step already started
    assert x.landing(1, TransferKey(2, 0, PUSH), torch.float32, 3) is None  # a step after the next
    assert x.landing(1, TransferKey(1, 1, PULL), torch.float32, 3) is None  # its push of step 1 has not run here
    assert x.landing(1, TransferKey(1, 0, PUSH), torch.float32, 4) is None  # the wrong size
    assert x.landing(1, TransferKey(1, 0, PUSH), torch.float64, 3) is None  # the wrong dtype
    assert x.landing(0, TransferKey(1, 0, PUSH), torch.float32, 3) is None  # no inbox for itself
    flat = torch.ones(n)
    pushed = xs[0].start(push, TaskBuffer(flat))  # step 1 under way on rank 0 (rank 1 has not pushed)
    assert x.landing(1, TransferKey(1, 0, PUSH), torch.float32, 3) is None
    assert x.landing(1, TransferKey(2, 0, PUSH), torch.float32, 3) is None  # its inbox is taken until its sum
    assert x.landing(1, TransferKey(1, 1, PULL), torch.float32, 3) is None  # nor a pull before that sum
    xs[1].start(push, TaskBuffer(torch.ones(n))).wait(TIMEOUT_S)
    pushed.wait(TIMEOUT_S)
    slice_of_1 = x.landing(1, TransferKey(1, 1, PULL), torch.float32, 3)  # rank 1's slice [3, 6) of that buffer
    assert slice_of_1 is not None and slice_of_1.data_ptr() == flat[3:].data_ptr() and slice_of_1.numel() == 3
    assert x.landing(1, TransferKey(2, 1, PULL), torch.float32, 3) is None  # not the step that push made
    assert x.landing(1, TransferKey(1, 1, PULL), torch.float32, 6) is None  # the wrong size


def test_a_pull_before_its_push_is_refused_naming_the_push() -> None:
    net = FakeNetwork(2)
    xs = exchanges(net)
    with pytest.raises(UnsupportedError, match=r"pull of task 't1'.*its push \(task 0\) has not run"):
        xs[0].start(task(1, "pull", 4, deps=(0,)), TaskBuffer(torch.zeros(4)))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("numel", [1, 2, 5, 1001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_after_the_pull_every_rank_holds_the_sum_of_what_every_rank_pushed(
    world: int, numel: int, dtype: torch.dtype
) -> None:
    net = FakeNetwork(world, max_delay_s=0.002)
    xs = exchanges(net)
    gen = torch.Generator().manual_seed(numel)
    flats = [torch.randn(numel, generator=gen, dtype=dtype) for _ in range(world)]
    expected = rank_sum(flats)  # each owner sums in rank order: bit for bit the same
    push_pull(xs, task(0, "push", numel), task(1, "pull", numel, deps=(0,)), flats)
    for f in flats:
        assert torch.equal(f, expected)
    assert all(x.losses[(0, PUSH)].lost_numel == 0 and x.losses[(1, PULL)].lost_numel == 0 for x in xs)


def test_overlapping_tasks_over_several_steps_complete_in_any_order() -> None:
    world, sizes = 3, [7, 300, 1, 64]
    net = FakeNetwork(world, max_delay_s=0.01, seed=3)
    xs = exchanges(net)
    pushes = [task(2 * i, "push", n) for i, n in enumerate(sizes)]
    pulls = [task(2 * i + 1, "pull", n, deps=(2 * i,)) for i, n in enumerate(sizes)]
    for step in range(3):
        flats = [[torch.full((n,), float(10 * r + i + step)) for i, n in enumerate(sizes)] for r in range(world)]
        pushed = [[x.start(p, TaskBuffer(flats[r][i])) for i, p in enumerate(pushes)] for r, x in enumerate(xs)]
        pulled = [[None] * len(sizes) for _ in range(world)]
        for i in reversed(range(len(sizes))):  # waited in reverse: pulls start as their pushes finish
            for r, x in enumerate(xs):
                pushed[r][i].wait(TIMEOUT_S)
                pulled[r][i] = x.start(pulls[i], TaskBuffer(flats[r][i]))
        for r in range(world):
            for i, n in enumerate(sizes):
                pulled[r][i].wait(TIMEOUT_S)
                expected = sum(float(10 * q + i + step) for q in range(world))
                assert torch.equal(flats[r][i], torch.full((n,), expected)), (step, r, i)
                assert xs[r].losses[(2 * i + 1, PULL)].step == step


def test_all_reduce_reduce_scatter_and_all_gather_run_as_push_and_pull() -> None:
    world = 3
    net = FakeNetwork(world, max_delay_s=0.002)
    xs = exchanges(net)
    flats = [torch.arange(12, dtype=torch.float32) * (r + 1) for r in range(world)]
    expected = torch.arange(12, dtype=torch.float32) * 6
    ar = [f.clone() for f in flats]
    for h in [x.start(task(0, "all_reduce", 12), TaskBuffer(f)) for x, f in zip(xs, ar, strict=True)]:
        h.wait(TIMEOUT_S)
    assert all(torch.equal(f, expected) for f in ar)
    shards = [torch.zeros(4) for _ in range(world)]
    buffers = [TaskBuffer(f, s) for f, s in zip(flats, shards, strict=True)]
    for h in [x.start(task(1, "reduce_scatter", 12), b) for x, b in zip(xs, buffers, strict=True)]:
        h.wait(TIMEOUT_S)
    assert all(torch.equal(s, expected[4 * r : 4 * r + 4]) for r, s in enumerate(shards))
    for h in [x.start(task(2, "all_gather", 12, deps=(1,)), b) for x, b in zip(xs, buffers, strict=True)]:
        h.wait(TIMEOUT_S)
    assert all(torch.equal(f, expected) for f in flats)


def test_a_lost_push_range_counts_as_zeros_and_is_recorded() -> None:
    world, n = 3, 9  # rank 0 owns [0, 3)
    net = FakeNetwork(world)
    net.lose[(1, 0, PUSH)] = [(0, 2)]  # rank 1's contribution to elements 0, 1 never arrives
    xs = exchanges(net)
    flats = [torch.full((n,), float(r + 1)) for r in range(world)]
    push_pull(xs, task(0, "push", n, loss_bound=0.7), task(1, "pull", n, deps=(0,)), flats)
    expected = torch.full((n,), 6.0)
    expected[:2] = 1.0 + 3.0
    for f in flats:
        assert torch.equal(f, expected)
    assert xs[0].losses[(0, PUSH)].lost_numel == 2 and xs[0].losses[(0, PUSH)].received_numel == 6
    assert xs[1].losses[(0, PUSH)].lost_numel == 0


def test_rescaling_scales_each_element_by_world_over_its_contributions() -> None:
    world, n = 4, 8  # rank 0 owns [0, 2)
    net = FakeNetwork(world)
    net.lose[(1, 0, PUSH)] = [(0, 1)]
    net.lose[(2, 0, PUSH)] = [(0, 1)]
    net.lose[(3, 0, PUSH)] = [(1, 2)]
    xs = exchanges(net, rescale_lost=True)
    flats = [torch.full((n,), 2.0) for _ in range(world)]
    push_pull(xs, task(0, "push", n, loss_bound=0.5), task(1, "pull", n, deps=(0,)), flats)
    # element 0: 2 of 4 arrived (4.0 * 4/2); element 1: 3 of 4 (6.0 * 4/3); the rest whole
    assert torch.allclose(flats[2], torch.tensor([8.0, 8.0, 8, 8, 8, 8, 8, 8]))


def test_a_lost_pull_range_keeps_the_previous_sum_of_the_task() -> None:
    world, n = 2, 6  # rank 1 owns [3, 6)
    net = FakeNetwork(world)
    xs = exchanges(net, pull_loss_bound=0.7)
    push, pull = task(0, "push", n), task(1, "pull", n, deps=(0,))
    flats = [torch.full((n,), 1.0), torch.full((n,), 2.0)]
    push_pull(xs, push, pull, flats)  # step 0: 3 everywhere
    net.lose[(1, 0, PULL)] = [(1, 3)]  # step 1: rank 0 does not get elements 4, 5 of the sum
    flats = [torch.full((n,), 10.0), torch.full((n,), 20.0)]
    push_pull(xs, push, pull, flats)
    assert torch.equal(flats[0], torch.tensor([30.0, 30, 30, 30, 3, 3]))
    assert torch.equal(flats[1], torch.full((n,), 30.0))
    assert xs[0].losses[(1, PULL)].lost_numel == 2 and xs[0].losses[(1, PULL)].step == 1


@pytest.mark.parametrize("pull_loss_bound", [0.0, 0.2])
def test_every_send_is_told_the_loss_bound_of_its_receive(pull_loss_bound: float) -> None:
    """A link marks what may be dropped first only where the receive may lose some (DLCP: a reliable pull's
    packets are all important); the exchange tells each send its receive's bound."""
    world, n = 3, 9
    net = FakeNetwork(world)
    xs = exchanges(net, pull_loss_bound=pull_loss_bound)
    flats = [torch.full((n,), float(r)) for r in range(world)]
    push_pull(xs, task(0, "push", n, loss_bound=0.05), task(1, "pull", n, deps=(0,)), flats)
    handles = [x.start(task(2, "all_reduce", n, loss_bound=0.1), TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    for h in handles:
        h.wait(TIMEOUT_S)
    assert len(net.send_bounds) == 4 * world * (world - 1)  # two tasks of two phases, every ordered pair
    assert net.send_bounds == net.recv_bounds
    assert {(k.task, k.phase, b) for (_, _, k), b in net.send_bounds.items()} == {
        (0, PUSH, 0.05),
        (1, PULL, pull_loss_bound),
        (2, PUSH, 0.1),
        (2, PULL, pull_loss_bound),
    }


def test_a_pull_tasks_own_bound_allows_loss_and_stale_fill_starts_from_zeros() -> None:
    world, n = 2, 6  # rank 1 owns [3, 6); the exchange itself is reliable on pulls
    net = FakeNetwork(world)
    xs = exchanges(net)
    push, pull = task(0, "push", n), task(1, "pull", n, deps=(0,), loss_bound=0.7)
    net.lose[(1, 0, PULL)] = [(0, 1)]  # step 0: rank 0 misses element 3 of the sum: nothing kept yet
    flats = [torch.full((n,), 1.0), torch.full((n,), 2.0)]
    push_pull(xs, push, pull, flats)
    assert torch.equal(flats[0], torch.tensor([3.0, 3, 3, 0, 3, 3]))
    net.lose[(1, 0, PULL)] = [(1, 3)]  # step 1: elements 4, 5 keep step 0's sum
    flats = [torch.full((n,), 10.0), torch.full((n,), 20.0)]
    push_pull(xs, push, pull, flats)
    assert torch.equal(flats[0], torch.tensor([30.0, 30, 30, 30, 3, 3]))


def test_an_all_reduce_returns_its_sum_before_its_sends_end_and_ends_only_once_they_have() -> None:
    world = 3
    net = FakeNetwork(world)
    net.held = []
    xs = exchanges(net)
    flats = [torch.arange(12, dtype=torch.float32) * (r + 1) for r in range(world)]
    handles = [x.start(task(0, "all_reduce", 12), TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    deadline = time.monotonic() + TIMEOUT_S
    while not all(torch.equal(f, torch.arange(12, dtype=torch.float32) * 6) for f in flats):
        assert time.monotonic() < deadline, "the pulls did not run while the pushes' sends were still under way"
        time.sleep(0.001)
    assert len(net.held) == 2 * world * (world - 1)  # every push's and every pull's send, none ended
    assert not any(h.is_completed() for h in handles)
    for t in net.held:
        t.finish()
    for h in handles:
        h.wait(TIMEOUT_S)


def test_a_send_that_fails_after_its_phase_finished_fails_the_task_naming_it() -> None:
    net = FakeNetwork(2)
    net.held = []
    xs = exchanges(net)
    handles = [x.start(task(0, "all_reduce", 4), TaskBuffer(torch.ones(4))) for x in xs]
    deadline = time.monotonic() + TIMEOUT_S
    while len(net.held) < 4:  # both pushes' sends, then both pulls'
        assert time.monotonic() < deadline
        time.sleep(0.001)
    net.held[0].finish(error=RuntimeCommError("the connection to rank 1 failed"))
    for t in net.held[1:]:
        t.finish()
    with pytest.raises(RuntimeCommError, match=r"ps all_reduce of task 't0' \(step 0\) on rank 0: the connection"):
        handles[0].wait(TIMEOUT_S)
    handles[1].wait(TIMEOUT_S)


def test_an_all_reduce_ends_with_its_sum_detaching_its_sends_and_close_waits_for_them() -> None:
    net = FakeNetwork(2)
    net.held, net.detachable = [], True
    xs = exchanges(net)
    flats = [torch.full((4,), 1.0), torch.full((4,), 2.0)]
    handles = [x.start(task(0, "all_reduce", 4), TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    for h in handles:
        h.wait(TIMEOUT_S)  # no send has ended: each goes on, detached
    assert all(torch.equal(f, torch.full((4,), 3.0)) for f in flats)
    assert len(net.held) == 4 and not any(t.is_completed() for t in net.held)
    assert all(isinstance(t, DetachableTransfer) and t.detached for t in net.held)
    closing = threading.Thread(target=xs[0].close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # close waits for the sends that went on
    assert not any(cast(Chained, h).settle(0.0) for h in handles)
    for t in net.held:
        t.finish()
    assert all(cast(Chained, h).settle(0.0) for h in handles)  # the last send's end settled each task at once
    closing.join(TIMEOUT_S)
    assert not closing.is_alive()
    xs[1].close()


def test_an_all_reduce_whose_sends_cannot_be_detached_now_ends_with_them() -> None:
    net = FakeNetwork(2)
    net.held, net.detachable, net.refuse = [], True, True
    xs = exchanges(net)
    flats = [torch.full((4,), 1.0), torch.full((4,), 2.0)]
    handles = [x.start(task(0, "all_reduce", 4), TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    deadline = time.monotonic() + TIMEOUT_S
    while not all(torch.equal(f, torch.full((4,), 3.0)) for f in flats):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert len(net.held) == 4 and not any(h.is_completed() for h in handles)
    for t in net.held:
        t.finish()
    for h in handles:
        h.wait(TIMEOUT_S)


def test_a_push_that_only_sends_ends_with_its_sends_even_if_they_could_be_detached() -> None:
    net = FakeNetwork(2)
    net.held, net.detachable = [], True
    xs = exchanges(net, servers=(0,))
    handles = [x.start(task(0, "push", 4), TaskBuffer(torch.ones(4))) for x in xs]
    handles[0].wait(TIMEOUT_S)  # the server: its receive ended, and it sends nothing
    assert len(net.held) == 1 and not handles[1].is_completed()  # the worker's push: sends only
    assert not cast(DetachableTransfer, net.held[0]).detached
    net.held[0].finish()
    handles[1].wait(TIMEOUT_S)


def test_a_detached_send_that_fails_after_its_task_ended_fails_the_next_start_naming_both() -> None:
    net = FakeNetwork(2)
    net.held, net.detachable = [], True
    xs = exchanges(net)
    handles = [x.start(task(0, "all_reduce", 4), TaskBuffer(torch.ones(4))) for x in xs]
    for h in handles:
        h.wait(TIMEOUT_S)
    net.held[0].finish(error=RuntimeCommError("no STOP from the receiver within 10 s"))
    with pytest.raises(
        RuntimeCommError,
        match=r"ps all_reduce of task 't0' \(step 1\) on rank \d: an earlier task failed: ps all_reduce of task "
        r"'t0' \(step 0\) on rank \d \(a send that went on after the task ended\): no STOP",
    ):
        for x in xs:
            x.start(task(0, "all_reduce", 4), TaskBuffer(torch.ones(4)))
    for t in net.held[1:]:
        t.finish()


def test_a_loss_above_the_bound_fails_the_task_naming_it() -> None:
    net = FakeNetwork(2)
    net.lose[(1, 0, PUSH)] = [(0, 3)]
    xs = exchanges(net)
    flats = [torch.ones(6), torch.ones(6)]
    handles = [x.start(task(0, "push", 6, loss_bound=0.5), TaskBuffer(f)) for x, f in zip(xs, flats, strict=True)]
    with pytest.raises(RuntimeCommError, match=r"ps push of task 't0' \(step 0\) on rank 0: .*lost 3, above the bound"):
        handles[0].wait(TIMEOUT_S)
    handles[1].wait(TIMEOUT_S)


def test_a_peer_that_never_starts_ends_the_wait_with_an_error_naming_the_task() -> None:
    net = FakeNetwork(2)
    x = PsExchange(net.links[0], timeout_s=0.3)  # type: ignore[arg-type]
    h = x.start(task(5, "push", 10), TaskBuffer(torch.ones(10)))
    t0 = time.monotonic()
    assert not h.is_completed()
    assert time.monotonic() - t0 < 0.05  # never blocks
    with pytest.raises(RuntimeCommError, match=r"push of task 't5' \(step 0\) on rank 0"):
        h.wait(0.05)  # the caller's bound
    with pytest.raises(RuntimeCommError, match=r"push of task 't5' \(step 0\) on rank 0: .*did not complete within"):
        h.wait()  # the exchange's own
    assert time.monotonic() - t0 < 2.0
    x.close()
