"""The compute model: what a worker class computes, per-rank batch sizes, and a custom model plugged in."""

from __future__ import annotations

import dataclasses

import pytest

from commsched.cluster import Cluster
from commsched.errors import ScheduleError
from commsched.plan.batches import rank_compute_fn
from commsched.sim import ClassCompute, ProfileCompute, SimOptions, WorkerClass, simulate, worker_classes
from commsched.sim.compute import batch_factor
from commsched.sim.ideal import ideal
from commsched.workload import Workload

from sim_builders import make_cluster, make_workload

FWD = [2.0, 3.0, 1.0, 2.0]
BWD = [4.0, 2.0, 3.0, 1.0]
NUMEL = [300_000, 200_000, 500_000, 100_000]


class DoubleBackward:
    """The profile, with every backward time twice as long (a compute model written outside the simulator)."""

    def timings(self, workload: Workload, worker: WorkerClass, update_ms: float) -> ClassCompute:
        base = ProfileCompute().timings(workload, worker, update_ms)
        return dataclasses.replace(
            base,
            backward_s=2 * base.backward_s,
            grad_ready_s=tuple(2 * r for r in base.grad_ready_s),
            backward_layer_s=tuple(2 * b for b in base.backward_layer_s),
            compute_s=base.compute_s + base.backward_s,
        )


def test_profile_compute_scales_the_profile_by_speed_and_batch() -> None:
    workload = make_workload(FWD, BWD, NUMEL, batch_size=32)
    model = ProfileCompute()
    base = model.timings(workload, WorkerClass(0, 1.0, (0,), 32), update_ms=2.0)
    assert base.forward_s == pytest.approx([f * 1e-3 for f in FWD])
    assert base.backward_s == pytest.approx(sum(BWD) * 1e-3)
    assert base.grad_ready_s == pytest.approx([r * 1e-3 for r in workload.grad_ready_ms])
    assert sum(base.update_s) == pytest.approx(2e-3)
    assert base.compute_s == pytest.approx((sum(FWD) + sum(BWD) + 2.0) * 1e-3)
    # half speed and double batch: each 2x, together 4x
    for speed, batch, factor in ((0.5, 32, 2.0), (1.0, 64, 2.0), (0.5, 64, 4.0), (1.0, 16, 0.5)):
        scaled = model.timings(workload, WorkerClass(0, speed, (0,), batch), update_ms=2.0)
        assert scaled.forward_s == pytest.approx([f * factor for f in base.forward_s])
        assert scaled.grad_ready_s == pytest.approx([r * factor for r in base.grad_ready_s])
        assert scaled.compute_s == pytest.approx(base.compute_s * factor)


def test_a_compute_model_that_doubles_backward_adds_one_backward_to_a_non_overlapping_iteration() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    cluster = make_cluster(4, 8.0, 5.0)
    for policy in ("no_overlap", "ddp"):
        default = simulate(workload, cluster, policy, 4, 1)
        doubled = simulate(workload, cluster, policy, 4, 1, compute=DoubleBackward())
        assert doubled.compute_ms == pytest.approx(default.compute_ms + sum(BWD))
        if policy == "no_overlap":  # communication starts after backward: the whole extra backward is exposed
            assert doubled.iteration_ms == pytest.approx(default.iteration_ms + sum(BWD))
        else:
            assert default.iteration_ms < doubled.iteration_ms <= default.iteration_ms + sum(BWD) + 1e-9
    # the trace shows the longer backward too
    trace = simulate(workload, cluster, "no_overlap", 2, 0, compute=DoubleBackward()).trace
    assert trace is not None
    back = [e for e in trace.events if e.kind == "backward" and e.iteration == 1]
    assert max(e.end_s for e in back) - min(e.start_s for e in back) == pytest.approx(2 * sum(BWD) * 1e-3)
    # the bound uses the same model
    assert ideal(workload, cluster, compute=DoubleBackward()).compute_ms == pytest.approx(
        ideal(workload, cluster).compute_ms + sum(BWD)
    )


def test_per_rank_batch_sizes_group_ranks_into_classes_by_speed_and_batch() -> None:
    cluster = make_cluster(5, speeds=[1.0, 1.0, 1.0, 0.5, 0.5])
    classes = worker_classes(cluster, batch_sizes=[32, 16, 32, 16, 16])
    assert [(c.speed, c.batch_size, c.ranks) for c in classes] == [
        (1.0, 32, (0, 2)),
        (1.0, 16, (1,)),
        (0.5, 16, (3, 4)),
    ]
    assert [c.batch_size for c in worker_classes(cluster, default_batch=8)] == [8, 8]


def test_a_rank_with_twice_the_batch_computes_like_a_rank_at_half_speed() -> None:
    workload = make_workload(FWD, BWD, NUMEL, batch_size=32)
    for policy in ("ddp", "wfbp", "dear"):
        big_batch = simulate(workload, make_cluster(4, 8.0), policy, 4, 1, batch_sizes=[32, 32, 32, 64])
        slow = simulate(workload, make_cluster(4, 8.0, speeds=[1, 1, 1, 0.5]), policy, 4, 1)
        assert [len(c.ranks) for c in big_batch.classes] == [3, 1]
        assert big_batch.iteration_ms == pytest.approx(slow.iteration_ms)
        assert big_batch.compute_ms == pytest.approx(2 * (sum(FWD) + sum(BWD)))
        # throughput counts every rank's own batch
        assert big_batch.samples_per_s == pytest.approx((3 * 32 + 64) / (big_batch.iteration_ms * 1e-3))
        assert slow.samples_per_s == pytest.approx(4 * 32 / (slow.iteration_ms * 1e-3))


def test_the_same_batch_on_every_rank_is_the_default() -> None:
    workload = make_workload(FWD, BWD, NUMEL, batch_size=32)
    cluster = make_cluster(4, 8.0, speeds=[1, 1, 0.5, 0.5])
    default = simulate(workload, cluster, "dear", 4, 1, trace=False)
    explicit = simulate(workload, cluster, "dear", 4, 1, trace=False, batch_sizes=[32] * 4)
    assert explicit.iteration_ms == default.iteration_ms
    assert explicit.samples_per_s == default.samples_per_s
    assert [c.batch_size for c in default.classes] == [32, 32]


@pytest.mark.parametrize(
    ("batch_sizes", "message"),
    [
        ([32, 32, 32], "batch_sizes has 3 entries, the cluster has 4 workers"),
        ([32, 0, 32, 32], r"batch_sizes\[1\] must be an integer >= 1, got 0"),
        ([32, 32, 16.5, 32], r"batch_sizes\[2\] must be an integer >= 1, got 16.5"),
    ],
)
def test_batch_sizes_that_do_not_fit_the_cluster_are_refused(batch_sizes: list, message: str) -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    with pytest.raises(ScheduleError, match=message):
        simulate(workload, make_cluster(4), "ddp", 2, 0, batch_sizes=batch_sizes)


def test_a_batch_curve_follows_its_measured_points_and_extends_its_end_segments() -> None:
    curve = ((8, 150.0), (16, 260.0), (32, 480.0))
    assert batch_factor(curve, 16, 16) == 1.0
    assert batch_factor(curve, 8, 16) == pytest.approx(150 / 260)  # a fixed cost: more than half at half the batch
    assert batch_factor(curve, 24, 16) == pytest.approx(370 / 260)  # between two points
    assert batch_factor(curve, 40, 16) == pytest.approx(590 / 260)  # beyond the last: along the last segment
    assert batch_factor(curve, 4, 16) == pytest.approx(95 / 260)  # before the first: along the first
    assert batch_factor(((8, 100.0), (16, 300.0)), 2, 16) == pytest.approx(25 / 300)  # <= 0 there: ∝ from (8, 100)
    assert batch_factor((), 8, 16) == 0.5  # no curve: in proportion


def test_profile_compute_and_the_split_search_use_a_ranks_batch_curve_alike() -> None:
    workload = make_workload(FWD, BWD, NUMEL, batch_size=16)
    curve = ((8, 150.0), (16, 260.0), (32, 480.0))
    cluster = make_cluster(2, speeds=[1.0, 0.5])
    spec = cluster.model_dump()
    spec["nodes"][1]["devices"][0]["model_batch_ms"] = {workload.model: dict(curve)}
    curved = Cluster.from_dict(spec)
    classes = worker_classes(curved, workload.model, [8, 8], 16)
    assert [c.curve for c in classes] == [(), curve]  # same speed and batch would not group them: curves differ
    base = ProfileCompute().timings(workload, WorkerClass(0, 1.0, (0,), 16), 0.0).compute_s
    slow = ProfileCompute().timings(workload, classes[1], 0.0)
    assert slow.compute_s == pytest.approx(base / 0.5 * 150 / 260)
    compute_s = rank_compute_fn(workload, curved)
    assert compute_s(1, 8) == pytest.approx(slow.compute_s)
    assert compute_s(0, 8) == pytest.approx(base / 2)


def test_communications_cpu_work_takes_longer_on_a_slower_rank_only_when_asked() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    cpu = {"cpu_per_task_ms": 0.5, "cpu_ms_per_mb": 0.2}
    for speeds in ([1.0, 1.0], [1.0, 0.25]):
        cluster = make_cluster(2, 8.0, 5.0, speeds=speeds)
        plain = simulate(workload, cluster, "wfbp", 6, 2, options=SimOptions(**cpu))
        scaled = simulate(workload, cluster, "wfbp", 6, 2, options=SimOptions(**cpu, cpu_scales_with_speed=True))
        if speeds[1] == 1.0:
            assert scaled.iteration_ms == pytest.approx(plain.iteration_ms)
        else:  # the slow rank pays 4x the CPU work while it computes
            assert scaled.iteration_ms > plain.iteration_ms
    with pytest.raises(ScheduleError, match="cpu_scales_with_speed must be true or false, got 'yes'"):
        SimOptions(cpu_scales_with_speed="yes")  # type: ignore[arg-type]
