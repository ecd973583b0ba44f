"""The driver side of the Scheduler contract, one behaviour per test."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from commsched.errors import ScheduleError
from commsched.schedule import Action, CommPlan, Launch, NetworkEstimate, Scheduler, Wait, build_scheduler
from commsched.schedule.base import UpdateMode
from commsched.schedule.fusion import make_task, whole
from commsched.schedule.knobs import NoKnobs
from commsched.sim import SimOptions, Simulation, simulate
from commsched.sim.costs import CommModel
from commsched.trace import Trace, TraceEvent
from commsched.workload import Workload

from sim_builders import make_cluster, make_workload

FWD = [2.0, 3.0, 1.0, 2.0]
BWD = [4.0, 2.0, 3.0, 1.0]
NUMEL = [300_000, 200_000, 500_000, 100_000]


def _run(scheduler: Scheduler, iterations: int = 3, warmup: int = 1) -> Simulation:
    cluster = make_cluster(2, 8.0)
    opts = SimOptions()
    sim = Simulation(
        scheduler.plan.workload, cluster, scheduler, iterations, warmup, opts, CommModel.from_cluster(cluster)
    )
    sim.run()
    return sim


def _per_tensor_plan(workload: Workload, update: UpdateMode = "step") -> CommPlan:
    tasks = tuple(
        make_task(workload, t, "all_reduce", whole(workload, [t]), f"t{t}") for t in range(len(workload.tensors))
    )
    return CommPlan("test", workload, NetworkEstimate(2, 1e9), tasks, update, NoKnobs())


def _events(trace: Trace | None, kind: str, worker: int = 0, iteration: int | None = None) -> list[TraceEvent]:
    assert trace is not None
    return [
        e
        for e in trace.events
        if e.kind == kind and e.worker == worker and (iteration is None or e.iteration == iteration)
    ]


def test_a_single_worker_iteration_is_forward_plus_backward_plus_update() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    for policy in ("ddp", "dear", "bytescheduler"):
        result = simulate(workload, make_cluster(1), policy, 4, 1, options={"update_ms": 1.5})
        assert result.iteration_ms == pytest.approx(sum(FWD) + sum(BWD) + 1.5)
        assert result.exposed_comm_ms == pytest.approx(0.0, abs=1e-9)
        assert result.gpu_busy == pytest.approx(1.0)


def test_dear_reduce_scatters_under_backward_and_all_gathers_under_forward() -> None:
    workload = make_workload([5.0] * 8, [10.0] * 8, [2_000_000] * 8)
    result = simulate(workload, make_cluster(4, 10.0, 5.0), "dear", 4, 1, threshold_mb=10)
    trace = result.trace

    def overlaps(a: list, b: list) -> float:
        return sum(max(0.0, min(x.end_s, y.end_s) - max(x.start_s, y.start_s)) for x in a for y in b)

    for k in (2, 3):
        rs = _events(trace, "reduce_scatter", iteration=k)
        ag = _events(trace, "all_gather", iteration=k - 1)  # gathers of k-1 run during forward k
        assert rs and ag
        assert overlaps(rs, _events(trace, "backward", iteration=k)) > 0.5 * sum(e.duration_s for e in rs)
        assert overlaps(ag, _events(trace, "forward", iteration=k)) > 0.5 * sum(e.duration_s for e in ag)


def test_a_slow_worker_delays_every_collective_until_its_gradients_are_ready() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    fast = simulate(workload, make_cluster(4, 8.0), "wfbp", 3, 1)
    slow = simulate(workload, make_cluster(4, 8.0, speeds=[1, 1, 1, 0.5]), "wfbp", 3, 1)
    assert slow.iteration_ms > fast.iteration_ms
    assert [len(c.ranks) for c in slow.classes] == [3, 1]
    trace = slow.trace
    ready_ms = {t.name: r for t, r in zip(workload.tensors, workload.grad_ready_ms, strict=True)}
    for k in (1, 2):
        start = min(e.start_s for e in _events(trace, "backward", worker=3, iteration=k))
        for e in _events(trace, "all_reduce", iteration=k):  # wfbp: one task per tensor, named after it
            assert e.start_s >= start + ready_ms[e.task] / 0.5 * 1e-3 - 1e-12


def test_launches_are_held_in_order_until_their_gradients_are_ready() -> None:
    """A scheduler that launches every task up front, output layer last: nothing starts before its input."""
    workload = make_workload(FWD, BWD, NUMEL)

    class UpFront(Scheduler):
        name: ClassVar[str] = "upfront"

        def on_forward_pre(self, layer: int) -> Sequence[Action]:
            return [Launch(t) for t in range(len(self.plan.tasks))] if layer == 0 else ()

    sim = _run(UpFront(_per_tensor_plan(workload)))
    trace = sim.trace
    for k in (1, 2):
        comm = sorted(_events(trace, "all_reduce", iteration=k), key=lambda e: e.start_s)
        assert [e.task for e in comm] == ["t0", "t1", "t2", "t3"]  # issue order kept
        bstart = min(e.start_s for e in _events(trace, "backward", iteration=k))
        # t0 is ready last (end of backward): nothing may start before it
        assert comm[0].start_s >= bstart + sum(BWD) * 1e-3 - 1e-12


def test_wait_blocks_the_scheduler_but_not_the_compute() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    seen: list[tuple[str, float]] = []

    class Pacer(Scheduler):
        name: ClassVar[str] = "pacer"

        def __init__(self, plan: CommPlan, sim_clock: list) -> None:
            super().__init__(plan)
            self.clock = sim_clock

        def on_grad_ready(self, tensor: int) -> Sequence[Action]:
            seen.append((f"ready{tensor}", self.clock[0].loop.now))
            return [Launch(tensor), Wait(tensor)]

    holder: list = []
    scheduler = Pacer(_per_tensor_plan(workload), holder)
    cluster = make_cluster(2, 0.5)  # slow network: each all-reduce takes longer than the backward gaps
    sim = Simulation(workload, cluster, scheduler, 2, 0, SimOptions(), CommModel.from_cluster(cluster))
    holder.append(sim)
    sim.run()
    # events reach the scheduler only after the previous task completed...
    ends = sorted(e.end_s for e in _events(sim.trace, "all_reduce", iteration=0))
    deliveries = [t for name, t in seen[:4]]
    assert deliveries[1:] == pytest.approx(ends[:3])
    # ...while backward itself ran at full speed
    back = _events(sim.trace, "backward", iteration=0)
    assert max(e.end_s for e in back) - min(e.start_s for e in back) == pytest.approx(sum(BWD) * 1e-3)


def test_completions_reach_only_schedulers_that_ask_for_them() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    calls: dict[bool, int] = {}

    class Counting(Scheduler):
        name: ClassVar[str] = "counting"

        def on_grad_ready(self, tensor: int) -> Sequence[Action]:
            return (Launch(tensor),)

        def on_comm_done(self, task: int) -> Sequence[Action]:
            calls[self.uses_completions] = calls.get(self.uses_completions, 0) + 1
            return ()

    class CountingWithCompletions(Counting):
        uses_completions: ClassVar[bool] = True

    for cls in (Counting, CountingWithCompletions):
        _run(cls(_per_tensor_plan(workload)), iterations=2, warmup=0)
    assert calls.get(False, 0) == 0
    assert calls[True] == 2 * len(NUMEL)


def test_a_scheduler_that_never_launches_is_reported_not_hung() -> None:
    workload = make_workload(FWD, BWD, NUMEL)

    class Lazy(Scheduler):
        name: ClassVar[str] = "lazy"

    with pytest.raises(ScheduleError, match=r"stalled.*waits at step 0"):
        _run(Lazy(_per_tensor_plan(workload, "step")))
    with pytest.raises(ScheduleError, match="waits before layer 'l0' of iteration 1"):
        _run(Lazy(_per_tensor_plan(workload, "forward")))


def test_one_channel_never_overlaps_collectives_and_more_channels_do() -> None:
    workload = make_workload(FWD, BWD, [4_000_000] * 4)
    knobs: dict[str, Any] = {"partition_mb": 2.0, "credit_mb": 8.0}

    def overlapping(max_concurrent: int) -> int:
        result = simulate(
            workload,
            make_cluster(4, 4.0, 10.0),
            "bytescheduler",
            3,
            1,
            options={"max_concurrent": max_concurrent},
            **knobs,
        )
        comm = sorted(_events(result.trace, "all_reduce"), key=lambda e: e.start_s)
        return sum(1 for a, b in itertools.pairwise(comm) if b.start_s < a.end_s - 1e-12)

    assert overlapping(1) == 0
    assert overlapping(4) > 0


def test_overlapping_collectives_hide_startup_latency() -> None:
    """wfbp with tiny tensors is latency-bound: running 4 at once overlaps their α terms."""
    workload = make_workload([0.5] * 8, [0.2] * 8, [1000] * 8)
    cluster = make_cluster(16, 10.0, 50.0)
    one = simulate(workload, cluster, "wfbp", 3, 1, options={"max_concurrent": 1})
    four = simulate(workload, cluster, "wfbp", 3, 1, options={"max_concurrent": 4})
    assert four.iteration_ms < one.iteration_ms - 2.0


def test_trace_names_tasks_like_the_plan_and_loads_back_from_chrome_json(tmp_path) -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    result = simulate(workload, make_cluster(4, 8.0), "ddp", 2, 1, bucket_cap_mb=1.0, first_bucket_mb=0.5)
    plan = build_scheduler("ddp", workload, NetworkEstimate(4, 1e9), bucket_cap_mb=1.0, first_bucket_mb=0.5).plan
    assert result.trace is not None
    names = {e.task for e in result.trace.events if e.kind == "all_reduce"}
    assert names == {t.name for t in plan.tasks}
    assert {e.kind for e in result.trace.events} >= {"forward", "backward", "all_reduce"}
    path = tmp_path / "trace.json"
    result.trace.save_chrome(path)
    loaded = Trace.load(path)
    assert loaded.events == result.trace.events
    assert loaded.meta["policy"] == "ddp" and loaded.meta["source"] == "simulated"


def test_unknown_options_and_bad_values_are_clear_errors() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    cluster = make_cluster(2)
    with pytest.raises(ScheduleError, match=r"unknown option.*colour"):
        simulate(workload, cluster, "ddp", options={"colour": 1})
    with pytest.raises(ScheduleError, match="max_concurrent must be >= 1"):
        simulate(workload, cluster, "ddp", options={"max_concurrent": 0})
    with pytest.raises(ScheduleError, match="unknown algorithm"):
        simulate(workload, cluster, "ddp", options={"algorithm": "butterfly"})
    with pytest.raises(ScheduleError, match="unknown knob"):
        simulate(workload, cluster, "ddp", bucket_size=3)
    with pytest.raises(ScheduleError, match="unknown policy"):
        simulate(workload, cluster, "fastest")
    with pytest.raises(ScheduleError, match=r"knob .partition_mb. must be a number > 0"):
        simulate(workload, cluster, "bytescheduler", partition_mb=-1)


def test_update_time_is_paid_once_per_iteration_in_both_update_modes() -> None:
    workload = make_workload(FWD, BWD, NUMEL)
    cluster = make_cluster(2, 1000.0)  # communication negligible
    for policy in ("ddp", "dear"):
        base = simulate(workload, cluster, policy, 3, 1).iteration_ms
        slower = simulate(workload, cluster, policy, 3, 1, options={"update_ms": 2.0}).iteration_ms
        assert slower - base == pytest.approx(2.0, abs=0.05)


def test_each_worker_class_runs_its_own_scheduler_unless_it_uses_completions() -> None:
    """DeAR (no completions) launches an all-gather when *this* worker's forward reaches the group, as on a
    real rank; so on a cluster with a slow worker the gather waits for the slow worker's forward."""
    workload = make_workload([4.0] * 6, [4.0] * 6, [500_000] * 6)
    cluster = make_cluster(2, 40.0, speeds=[1.0, 0.25])
    result = simulate(workload, cluster, "dear", 3, 1, threshold_mb=1.0)  # one group per layer
    trace = result.trace
    k = 2
    slow_forward = {e.task: e for e in _events(trace, "forward", worker=1, iteration=k)}
    for g in range(1, 5):  # on_forward_pre(g) launches ag{g+1}; layer g starts when layer g-1 ends
        gather = next(e for e in _events(trace, "all_gather", iteration=k - 1) if e.task == f"ag{g + 1}")
        assert gather.start_s >= slow_forward[f"l{g - 1}"].end_s - 1e-12
