"""What communicating beside compute costs (``commsched.bench.overlap``) and how the measured spec takes it."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
import torch.distributed as dist

from commsched import zoo
from commsched._sockets import free_port
from commsched.bench.hetero_spec import measured_spec
from commsched.bench.overlap import MIN_COMM_RATE, OVERLAP_REPEATS, OverlapTimes, time_overlap
from commsched.errors import SpecError
from commsched.models import build_model, synthetic_batch
from commsched.testbed.linkrate import LinkRate

MIB = 2**20


def _times(alone: float, beside: float, allreduce_beside: float, nbytes: int = 20 * MIB) -> OverlapTimes:
    # five rounds around each value, so that the medians are the values
    def spread(v: float) -> tuple[float, ...]:
        return (v - 2.0, v, v + 1.0, v - 1.0, v + 3.0)

    return OverlapTimes(nbytes, spread(alone), spread(beside), spread(allreduce_beside), spread(200.0))


def test_the_cost_per_mib_is_the_backwards_growth_over_the_bytes_moved_beside_it() -> None:
    # all-reduce (300 ms) ends before the backward (900 ms): all 20 MiB moved beside it
    t = _times(800.0, 900.0, 300.0)
    assert (t.extra_ms, t.overlapped) == (100.0, 1.0)
    assert t.ms_per_mb() == pytest.approx(5.0)
    assert t.ms_per_mb(per_task_ms=20.0) == pytest.approx(4.0)  # the per-task work is charged apart


def test_an_all_reduce_that_outlasts_the_backward_counts_only_the_bytes_moved_meanwhile() -> None:
    t = _times(800.0, 900.0, 1800.0)  # half of the all-reduce's time fell beside the backward
    assert t.overlapped == pytest.approx(0.5)
    assert t.ms_per_mb() == pytest.approx(10.0)


def test_a_backward_no_slower_beside_the_all_reduce_costs_nothing_not_a_negative_cost() -> None:
    t = _times(900.0, 880.0, 300.0)
    assert t.extra_ms == -20.0 and t.ms_per_mb() == 0.0


def test_the_growth_is_paired_by_round_so_the_hosts_drift_between_rounds_cancels() -> None:
    # the host slows down from round 2 on (the beside timing first there): each round's difference
    # is 50 ms but in one, where the medians of the two would differ by 450
    alone, beside = (800.0, 800.0, 800.0, 1200.0, 1200.0), (850.0, 850.0, 1250.0, 1250.0, 1250.0)
    t = OverlapTimes(20 * MIB, alone, beside, beside, (200.0,) * 5)
    assert t.extra_ms == 50.0


def test_the_comm_rate_is_the_share_of_its_rate_the_all_reduce_kept_beside_compute() -> None:
    # alone 200 ms; beside the backward 300 ms, all of it inside 900 ms of compute: 2/3 of its rate
    assert _times(800.0, 900.0, 300.0).comm_rate(900.0) == pytest.approx(200.0 / 300.0)
    # 500 ms beside 400 ms of compute: the 300 ms it lost fell inside those 400 ms, so it kept a quarter
    # there (0.25 x 400 + 100 ms at full rate after = its 200 ms alone)
    assert _times(800.0, 900.0, 500.0).comm_rate(400.0) == pytest.approx(0.25)
    assert _times(800.0, 900.0, 190.0).comm_rate(900.0) == 1.0  # no slower beside compute: no slowdown
    assert _times(800.0, 900.0, 1200.0).comm_rate(500.0) == MIN_COMM_RATE  # more than compute can explain
    with pytest.raises(ValueError, match=r"computing_ms: must be > 0, got 0\.0"):
        _times(800.0, 900.0, 300.0).comm_rate(0.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"nbytes": 0},
        {"backward_alone_ms": ()},
        {"allreduce_beside_ms": (1.0, -1.0)},
        {"backward_beside_ms": (1.0, 2.0)},  # not one per round
    ],
)
def test_impossible_timings_are_refused(bad: dict[str, Any]) -> None:
    fields = {**asdict(_times(10.0, 20.0, 30.0)), **bad}
    with pytest.raises(ValueError, match=f"overlap.{next(iter(bad))}"):
        OverlapTimes(**fields)


def test_saved_timings_read_back_and_malformed_ones_name_their_source() -> None:
    t = _times(800.0, 900.0, 300.0)
    assert OverlapTimes.from_dict(asdict(t), "x") == t
    with pytest.raises(ValueError, match=r"rank1\.json: overlap"):
        OverlapTimes.from_dict({**asdict(t), "backward_beside_ms": "fast"}, "rank1.json")
    with pytest.raises(ValueError, match=r"rank1\.json: overlap"):
        OverlapTimes.from_dict({"nbytes": 4}, "rank1.json")


def _rank(workload: Any, overlap: OverlapTimes | dict[str, Any] | None, with_samples: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": json.loads(workload.to_json()), "update_ms": 2.0}
    if with_samples:  # an all-reduce with 1 ms + 1 ms per MiB of CPU work
        out["samples"] = [
            {"op": "all_reduce", "nbytes": n, "world_size": 2, "seconds": [1e-3 + n / 1e8], "cpu_seconds": [c]}
            for n, c in ((MIB, 2e-3), (4 * MIB, 5e-3), (16 * MIB, 17e-3))
        ]
    if overlap is not None:
        out["overlap"] = asdict(overlap) if isinstance(overlap, OverlapTimes) else overlap
    return out


def test_the_measured_spec_gives_each_device_its_overlap_cost_less_the_per_task_work() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, _times(800.0, 900.0, 300.0), True), _rank(workload, None, False)]
    links = [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)]
    spec = measured_spec(ranks, links, memory_gib=1.0)
    assert spec.cpu is not None and spec.cpu.per_op_ms == pytest.approx(1.0)
    # (100 ms - 1 ms per task) / 20 MiB; rank 1 measured nothing, so the simulator's option stays
    assert spec.cluster.worker_overlap_ms_per_mb() == pytest.approx((99.0 / 20, None))  # type: ignore[arg-type]


def test_the_spec_gives_the_comm_rate_to_the_ranks_that_computed_longest() -> None:
    workload = zoo.load("resnet18")
    links = [LinkRate(r, 100.0, 0.1, 4) for r in range(3)]
    # one collective, every rank sees it 100 ms slower (300 vs 200 ms); ranks 1 and 2 computed 900 and
    # 600 ms beside it, rank 0 only 300 (under half the longest: its share cannot be told)
    times = [_times(250.0, 300.0, 300.0), _times(800.0, 900.0, 300.0), _times(500.0, 600.0, 300.0)]
    ranks = [_rank(workload, t, r == 0) for r, t in enumerate(times)]
    spec = measured_spec(ranks, links, memory_gib=1.0)
    assert spec.cluster.worker_overlap_comm_rate() == (None, pytest.approx(2 / 3), pytest.approx(2 / 3))
    ranks[2] = _rank(workload, None, False)  # a rank without the rounds: none for anyone
    spec = measured_spec(ranks, links, memory_gib=1.0)
    assert spec.cluster.worker_overlap_comm_rate() == (None, None, None)


def test_a_malformed_overlap_measurement_is_refused_naming_the_rank() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, None, True), {**_rank(workload, {"nbytes": 4}, False), "rank": 1}]
    with pytest.raises(SpecError, match="rank 1: overlap"):
        measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)


@pytest.fixture
def group_of_one() -> Iterator[None]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_time_overlap_times_every_round_of_the_three_measurements(group_of_one: None) -> None:
    model = build_model("cnn", 0)
    rounds: list[int] = []
    times = time_overlap(model, synthetic_batch("cnn", 4, 0, 0, 0), 10_000, rounds.append)
    assert rounds == list(range(1 + OVERLAP_REPEATS))
    assert times.nbytes == 10_000
    timed = (times.backward_alone_ms, times.backward_beside_ms, times.allreduce_beside_ms, times.allreduce_alone_ms)
    assert all(len(t) == OVERLAP_REPEATS and min(t) > 0 for t in timed)
    # the all-reduce's end is when it completed, not when the backward did: alone in its group, it
    # completes long before a backward of the model ends
    assert statistics.median(times.allreduce_beside_ms) < statistics.median(times.backward_beside_ms)
    assert times.overlapped == 1.0
    assert all(p.grad is None for p in model.parameters())  # left as found
    assert times.extra_ms == pytest.approx(times.extra_ms)  # finite
