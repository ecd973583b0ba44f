"""LossLog: a lossy transport's launch records become per-iteration, per-tensor records with drop counters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from commsched.runtime.losses import LossLog
from commsched.schedule import CommPlan, NetworkEstimate, build_plan
from commsched.trace import Trace
from commsched.transport.bounded import DropCounters, LossReporting
from commsched.transport.exchange import PULL, PUSH, Loss
from commsched.zoo import load as load_zoo

NET = NetworkEstimate(2, 1.25e9, 20e-6)


class FakeSource:
    """A transport that reports what the test tells it to."""

    def __init__(self, launches: dict[int, int] | None = None) -> None:
        self.queue: list[Loss] = []
        self.counters = DropCounters(socket=0)
        self._launches = launches or {}

    def take_losses(self) -> list[Loss]:
        out, self.queue = self.queue, []
        return out

    def launches(self) -> dict[int, int]:
        return dict(self._launches)

    def drop_counters(self) -> DropCounters:
        return self.counters

    def start(self, *_: object) -> None: ...

    def close(self) -> None: ...


@pytest.fixture(scope="module")
def bucketed() -> CommPlan:
    """All-reduce buckets of several tensors each, as if a lossy transport carried them."""
    return build_plan("ddp", load_zoo("resnet18"), NET, bucket_cap_mb=4.0)  # type: ignore[arg-type]


def counter(values: list[int]) -> Callable[[], int]:
    return lambda: values[0]


def test_a_loss_across_two_tensors_is_split_between_them_and_lands_on_its_iteration(bucketed: CommPlan) -> None:
    task = next(t for t in bucketed.tasks if len(t.segments) >= 2)
    first, second = task.segments[0], task.segments[1]
    names = [bucketed.workload.tensors[s.tensor].name for s in (first, second)]
    source = FakeSource(launches={task.id: 5})  # launched 5 times under an earlier plan
    assert isinstance(source, LossReporting)
    qdisc = [100]
    trace = Trace()
    log = LossLog(0, trace, 0.0, counter(qdisc))
    log.plan_adopted(bucketed, 2, {"collective": source})  # type: ignore[dict-item]
    # elements [n0 - 3, n0 + 7) straddle the first two segments; 10 of them lost in the push of instance 1
    n0 = first.numel
    source.queue.append(Loss(6, 10, 1000, task.id, PUSH, ((n0 - 3, n0 + 7),), 0.05))
    source.queue.append(Loss(6, 0, 1000, task.id, PULL, (), 0.0))
    source.counters = DropCounters(injected=40, late=3, send_errors=0, socket=7)
    qdisc[0] = 112
    log.after_step(4)  # iteration 3 (= 2 + 6 - 5) is not complete yet
    assert not log.records
    log.after_step(5)
    [record] = log.records
    assert record.iteration == 3
    push = next(t for t in record.transfers if t.phase == "push")
    assert (push.task, push.lost_numel, push.received_numel, push.loss_bound) == (task.name, 10, 1000, 0.05)
    assert dict(zip(push.tensors, push.lost_by_tensor, strict=True))[names[0]] == 3
    assert dict(zip(push.tensors, push.lost_by_tensor, strict=True))[names[1]] == 7
    assert record.lost("push") == 10 and record.lost("pull") == 0
    assert record.by_tensor()[(names[0], "push")] == 3
    assert (record.drops.injected, record.drops.late, record.drops.socket, record.drops.qdisc) == (40, 3, 7, 12)
    assert log.worst["push"] == (0.01, 0.05)
    [event] = [e for e in trace.events if e.kind == "loss"]
    assert (event.task, event.iteration, event.bytes) == (task.name, 3, 40)  # float32: 4 bytes per element


def test_finish_completes_the_last_iteration_and_a_lossless_plan_records_nothing(bucketed: CommPlan) -> None:
    source = FakeSource()
    log = LossLog(1, None, 0.0)
    log.plan_adopted(bucketed, 0, {"collective": source})  # type: ignore[dict-item]
    source.queue.append(Loss(0, 0, 50, 0, PULL, (), 0.0))
    log.after_step(1)
    assert not log.records
    log.finish(1)
    assert [r.iteration for r in log.records] == [0] and log.records[0].drops.qdisc is None
    idle = LossLog(0, None, 0.0)
    idle.plan_adopted(bucketed, 0, {"collective": object()})  # type: ignore[dict-item]
    idle.after_step(3)
    assert not idle.active and not idle.records
