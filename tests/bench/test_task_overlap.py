"""What each runtime task costs beside the backward (``commsched.bench.task_overlap``) and how the spec takes it."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from commsched import zoo
from commsched.bench.batch_curve import proportional_share
from commsched.bench.hetero_spec import measured_spec
from commsched.bench.overlap import OverlapTimes
from commsched.bench.task_overlap import TaskOverlap, beside_backward, fit_costs
from commsched.errors import SpecError
from commsched.testbed.linkrate import LinkRate
from commsched.trace import TraceEvent

MIB = 2**20


def _rounds(alone: float, beside: float, tasks: int = 20, mib: float = 18.0) -> TaskOverlap:
    spread = (-2.0, 0.0, 1.0, -1.0, 3.0)  # the medians are the values
    return TaskOverlap(tuple(alone + d for d in spread), tuple(beside + d for d in spread), (tasks,) * 5, (mib,) * 5)


def test_the_cost_per_task_is_the_growth_less_the_bytes_share_over_the_tasks() -> None:
    t = _rounds(1800.0, 2400.0)  # 600 ms more beside 20 tasks moving 18 MiB
    assert t.extra_ms == 600.0
    assert t.ms_per_task(0.0) == pytest.approx(30.0)
    assert t.ms_per_task(5.0) == pytest.approx((600.0 - 90.0) / 20)
    assert t.ms_per_task(50.0) == 0.0  # the bytes explain more than all of it: no negative cost


def test_no_task_inside_the_backward_gives_no_cost_per_task() -> None:
    assert _rounds(1800.0, 1800.0, tasks=0, mib=0.0).ms_per_task(5.0) is None


def test_the_growth_pairs_each_round_so_the_hosts_drift_cancels() -> None:
    alone, beside = (800.0, 800.0, 1200.0, 1200.0, 1200.0), (850.0, 850.0, 1250.0, 1250.0, 1250.0)
    assert TaskOverlap(alone, beside, (4,) * 5, (2.0,) * 5).extra_ms == 50.0


@pytest.mark.parametrize(
    "bad", [{"alone_ms": ()}, {"tasks": (1, -1, 1, 1, 1)}, {"mib": (1.0, 2.0)}, {"beside_ms": (1.0,) * 4}]
)
def test_impossible_rounds_are_refused_naming_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"task_overlap.{next(iter(bad))}"):
        TaskOverlap(**{**asdict(_rounds(10.0, 20.0)), **bad})


def test_saved_rounds_read_back_and_malformed_ones_name_their_source() -> None:
    t = _rounds(1800.0, 2400.0)
    assert TaskOverlap.from_dict(json.loads(json.dumps(asdict(t))), "x") == t
    with pytest.raises(ValueError, match=r"rank2\.json: task_overlap"):
        TaskOverlap.from_dict({**asdict(t), "tasks": "many"}, "rank2.json")


def test_beside_backward_counts_the_tasks_started_inside_and_their_bytes_by_time_share() -> None:
    events = [
        TraceEvent("layer1", "backward", 0, 1.0, 2.0, iteration=3),
        TraceEvent("layer0", "backward", 0, 2.0, 3.0, iteration=3),
        TraceEvent("b0", "all_reduce", 0, 1.5, 2.5, bytes=4 * MIB, iteration=3),  # inside
        TraceEvent("b1", "all_reduce", 0, 2.0, 6.0, bytes=8 * MIB, iteration=3),  # a quarter inside
        TraceEvent("b2", "all_reduce", 0, 3.0, 3.5, bytes=8 * MIB, iteration=3),  # after it
        TraceEvent("b0", "all_reduce", 1, 1.5, 2.5, bytes=4 * MIB, iteration=3),  # another worker's
        TraceEvent("b0", "all_reduce", 0, 1.5, 2.5, bytes=4 * MIB, iteration=2),  # another iteration's
    ]
    assert beside_backward(events, 0, 3) == (pytest.approx(2000.0), 2, pytest.approx(6.0))
    assert beside_backward(events, 1, 3) is None  # no backward of worker 1 traced


def _rank(workload: Any, tasks: TaskOverlap | dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": json.loads(workload.to_json()), "update_ms": 2.0}
    out["samples"] = [
        {"op": "all_reduce", "nbytes": n, "world_size": 2, "seconds": [1e-3 + n / 1e8], "cpu_seconds": [c]}
        for n, c in ((MIB, 2e-3), (4 * MIB, 5e-3), (16 * MIB, 17e-3))
    ]  # 1 ms + 1 ms per MiB of CPU work
    spread = (-2.0, 0.0, 1.0, -1.0, 3.0)
    out["overlap"] = asdict(  # 100 ms over 20 MiB: (100 - 1 ms per task) / 20 = 4.95 ms/MiB
        OverlapTimes(20 * MIB, *(tuple(v + d for d in spread) for v in (800.0, 900.0, 300.0, 200.0)))
    )
    if tasks is not None:
        out["task_overlap"] = asdict(tasks) if isinstance(tasks, TaskOverlap) else tasks
    return out


def test_the_measured_spec_gives_each_device_its_cost_per_task_less_its_bytes_at_the_cost_per_mib() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, _rounds(1800.0, 2400.0)), _rank(workload, None)]
    spec = measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)
    per_mb = 99.0 / 20
    assert spec.cluster.worker_overlap_ms_per_mb() == pytest.approx((per_mb, per_mb))
    # rank 1 timed no runtime tasks: the simulator's per-task option stays
    assert spec.cluster.worker_overlap_ms_per_task() == pytest.approx(((600.0 - per_mb * 18.0) / 20, None))  # type: ignore[arg-type]


def test_malformed_task_rounds_are_refused_naming_the_rank() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, None), {**_rank(workload, {"alone_ms": [1.0]}), "rank": 1}]
    with pytest.raises(SpecError, match="rank 1: task_overlap"):
        measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)


def test_two_layouts_give_both_costs() -> None:
    # 6 tasks and 20 MiB grew the backward 170 ms; 1 task and 15 MiB, 110: 5 ms per task and 7 ms per MiB
    small, large = _rounds(500.0, 670.0, tasks=6, mib=20.0), _rounds(500.0, 610.0, tasks=1, mib=15.0)
    assert fit_costs(small, large) == pytest.approx((5.0, 7.0))
    large = _rounds(500.0, 645.0, tasks=1, mib=15.0)
    # the exact solution would make the per-task cost negative (many small tasks cost less per MiB than one
    # large): per MiB alone, least squares over both
    small = _rounds(500.0, 560.0, tasks=6, mib=20.0)
    per_mb = (20.0 * 60.0 + 15.0 * 145.0) / (20.0**2 + 15.0**2)
    assert fit_costs(small, large) == pytest.approx((0.0, per_mb))
    # a negative per-MiB cost: per task alone
    assert fit_costs(_rounds(500.0, 620.0, tasks=6, mib=2.0), _rounds(500.0, 530.0, tasks=2, mib=15.0)) == (
        pytest.approx((6 * 120.0 + 2 * 30.0) / (36 + 4)),
        pytest.approx(0.0, abs=1e-12),
    )
    assert fit_costs(_rounds(500.0, 490.0), _rounds(500.0, 480.0, tasks=1)) == (0.0, 0.0)  # no growth: no cost
    # three layouts: the least-squares fit; exact where they agree
    fine = _rounds(500.0, 500.0 + 20 * 5.0 + 20.0 * 7.0, tasks=20, mib=20.0)
    assert fit_costs(_rounds(500.0, 670.0, tasks=6, mib=20.0), _rounds(500.0, 610.0, tasks=1, mib=15.0), fine) == (
        pytest.approx(5.0),
        pytest.approx(7.0),
    )
    with pytest.raises(ValueError, match="layouts: two or more"):
        fit_costs(fine)


def test_where_both_layouts_were_timed_the_spec_takes_both_costs_from_them() -> None:
    workload = zoo.load("resnet18")
    ranks = [_rank(workload, _rounds(500.0, 670.0, tasks=6, mib=20.0)), _rank(workload, None)]
    ranks[0]["task_overlap_large"] = asdict(_rounds(500.0, 610.0, tasks=1, mib=15.0))
    spec = measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)
    assert spec.cluster.worker_overlap_ms_per_task() == pytest.approx((5.0, None))  # type: ignore[arg-type]
    assert spec.cluster.worker_overlap_ms_per_mb() == pytest.approx((7.0, 99.0 / 20))  # rank 1: the all-reduce's
    ranks[0]["task_overlap_large"] = {"alone_ms": []}
    with pytest.raises(SpecError, match=r"rank \? \(task_overlap_large\): task_overlap"):
        measured_spec(ranks, [LinkRate(0, 100.0, 0.1, 4), LinkRate(1, 100.0, 0.1, 4)], memory_gib=1.0)


def test_a_ranks_proportional_share_follows_its_speed() -> None:
    assert [proportional_share([100.0, 400.0, 400.0], 48, r) for r in range(3)] == [32, 8, 8]
    assert proportional_share([1.0, 1000.0], 4, 1) == 1  # at least one sample
    with pytest.raises(ValueError, match="must be > 0"):
        proportional_share([100.0, 0.0], 48, 0)
