"""Communication's CPU work charged to compute (``SimOptions.cpu_per_task_ms`` / ``cpu_ms_per_mb``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsched.cluster import Cluster, load_cluster
from commsched.errors import ScheduleError, SpecError
from commsched.sim import SimOptions, simulate

from sim_builders import make_cluster, make_workload

# Three layers of 1 MiB each (fp32): backward 10 ms per layer, forward 5 ms.
WORKLOAD = make_workload([5.0, 5.0, 5.0], [10.0, 10.0, 10.0], [2**18, 2**18, 2**18])
# 1 MiB all-reduced by 2 ranks at 1 Gbit/s: 8.4 ms, longer than any CPU charge below (the
# probe's all-reduce times include their own CPU work).
LINK = make_cluster(2, gbps=1.0)


def _iteration_ms(policy: str, **options: float) -> float:
    return simulate(WORKLOAD, LINK, policy, 6, 2, options=SimOptions(**options), trace=False).iteration_ms


def test_no_charge_reproduces_the_free_overlap_model() -> None:
    assert _iteration_ms("wfbp") == _iteration_ms("wfbp", cpu_per_task_ms=0.0, cpu_ms_per_mb=0.0)


def test_tasks_started_during_backward_delay_compute_by_their_cpu_work() -> None:
    # wfbp starts one all-reduce per layer as its gradient is ready: the first two start
    # while backward still runs, the last one as it ends (its CPU work falls into the
    # wait for it), so the iteration grows by two charges of 1 ms + 2 ms/MiB · 1 MiB = 3 ms.
    free = _iteration_ms("wfbp")
    charged = _iteration_ms("wfbp", cpu_per_task_ms=1.0, cpu_ms_per_mb=2.0)
    assert charged - free == pytest.approx(6.0, abs=0.05)


def test_a_task_started_while_the_worker_waits_costs_nothing() -> None:
    # no_overlap starts everything after backward, while the worker waits: no compute to slow.
    assert _iteration_ms("no_overlap", cpu_per_task_ms=3.0) == pytest.approx(_iteration_ms("no_overlap"), abs=1e-9)


def _all_reduce_ms(policy: str, **options: float) -> dict[str, float]:
    result = simulate(WORKLOAD, LINK, policy, 6, 2, options=SimOptions(**options), trace=True)
    events = [e for e in result.trace.events if e.iteration == 3 and e.worker == 0 and e.kind == "all_reduce"]
    return {e.task: e.duration_s * 1e3 for e in events}


def test_a_collective_whose_cpu_work_outlasts_the_network_takes_that_long_on_a_waiting_worker() -> None:
    # no_overlap's one 3 MiB bucket: 25.2 ms on the network, after backward while the workers wait
    assert _all_reduce_ms("no_overlap") == {"bucket0": pytest.approx(25.17, abs=0.01)}
    assert _all_reduce_ms("no_overlap", cpu_per_task_ms=20.0) == _all_reduce_ms("no_overlap")  # the network bounds
    assert _all_reduce_ms("no_overlap", cpu_per_task_ms=40.0) == {"bucket0": pytest.approx(40.0, abs=1e-6)}


def test_beside_backward_a_collectives_cpu_work_gets_half_the_core() -> None:
    # wfbp's first all-reduce (1 MiB, 8.4 ms on the network) starts with 20 ms of backward left: its 6 ms
    # of CPU work take 12 ms at half the core; the last starts as backward ends, the network bounds it.
    free = _all_reduce_ms("wfbp")
    shared = _all_reduce_ms("wfbp", cpu_per_task_ms=6.0)
    assert free == {name: pytest.approx(8.39, abs=0.01) for name in ("l2.t0", "l1.t0", "l0.t0")}
    assert shared == {"l2.t0": pytest.approx(12.0), "l1.t0": pytest.approx(12.0), "l0.t0": pytest.approx(free["l0.t0"])}


def test_more_tasks_cost_more_cpu() -> None:
    few = _iteration_ms("horovod", cpu_per_task_ms=2.0) - _iteration_ms("horovod")
    many = _iteration_ms("wfbp", cpu_per_task_ms=2.0) - _iteration_ms("wfbp")
    assert many >= few


@pytest.mark.parametrize("field", ["cpu_per_task_ms", "cpu_ms_per_mb"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "1"])
def test_bad_cpu_options_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ScheduleError, match=field):
        SimOptions(**{field: value})  # type: ignore[arg-type]


def test_fit_cpu_recovers_a_line_and_is_none_without_cpu_times() -> None:
    from commsched.profile.probe_fit import ProbeSample, fit_cpu

    def sample(nbytes: int, cpu: bool) -> ProbeSample:
        c = 2e-4 + 1e-9 * nbytes
        return ProbeSample("all_reduce", nbytes, 2, (1e-3, 1e-3, 1e-3), (c, c * 1.01, c * 0.99) if cpu else ())

    fit = fit_cpu([sample(n, True) for n in (2**14, 2**18, 2**22, 2**24)])
    assert fit is not None
    assert fit.per_op_s == pytest.approx(2e-4, rel=0.02)
    assert fit.per_byte_s == pytest.approx(1e-9, rel=0.02)
    assert fit_cpu([sample(n, False) for n in (2**14, 2**18)]) is None


def _with_overlap(per_mb: list[float | None], field: str = "overlap_ms_per_mb") -> Cluster:
    spec = LINK.to_dict()
    nodes = [
        {**node, "device": {**node["device"], **({} if value is None else {field: value})}}
        for node, value in zip(spec["nodes"], per_mb, strict=True)
    ]
    return Cluster.from_dict({**spec, "nodes": nodes})


def test_a_devices_measured_overlap_cost_replaces_cpu_ms_per_mb_in_what_compute_loses() -> None:
    # wfbp: two 1 MiB tasks start while backward runs (test above). Rank 1's device measured 5 ms per
    # MiB beside compute: it is charged 1 + 5 ms per task (its per-task work stays), rank 0 keeps
    # 1 + 2 ms; lock-step waits for rank 1, so the iteration grows by 2 x 6 ms, not 2 x 3 ms.
    options = SimOptions(cpu_per_task_ms=1.0, cpu_ms_per_mb=2.0)
    free = _iteration_ms("wfbp")
    measured = simulate(WORKLOAD, _with_overlap([None, 5.0]), "wfbp", 6, 2, options=options, trace=False)
    assert measured.iteration_ms - free == pytest.approx(12.0, abs=0.05)
    # a measured cost charges even where the options charge no CPU work at all
    alone = simulate(WORKLOAD, _with_overlap([5.0, 5.0]), "wfbp", 6, 2, options=SimOptions(), trace=False)
    assert alone.iteration_ms - free == pytest.approx(10.0, abs=0.05)


def test_a_devices_measured_cost_per_task_replaces_cpu_per_task_ms_and_keeps_the_bytes_charge() -> None:
    # as above, two 1 MiB tasks beside backward; rank 1 measured 5 ms per task: charged 5 + 2 ms per
    # task (its bytes at cpu_ms_per_mb), so lock-step grows by 2 x 7 ms; with both costs measured, 5 + 3
    # (past 8 ms per task the last all-reduce, not compute, ends the iteration)
    options = SimOptions(cpu_per_task_ms=1.0, cpu_ms_per_mb=2.0)
    free = _iteration_ms("wfbp")
    per_task = _with_overlap([None, 5.0], "overlap_ms_per_task")
    measured = simulate(WORKLOAD, per_task, "wfbp", 6, 2, options=options, trace=False)
    assert measured.iteration_ms - free == pytest.approx(14.0, abs=0.05)
    both = per_task.to_dict()
    both["nodes"][1]["device"]["overlap_ms_per_mb"] = 3.0
    measured = simulate(WORKLOAD, Cluster.from_dict(both), "wfbp", 6, 2, options=options, trace=False)
    assert measured.iteration_ms - free == pytest.approx(16.0, abs=0.05)


@pytest.mark.parametrize("field", ["overlap_ms_per_mb", "overlap_ms_per_task"])
def test_ranks_with_different_overlap_costs_are_simulated_apart(field: str) -> None:
    from commsched.sim.compute import worker_classes

    classes = worker_classes(_with_overlap([None, 5.0], field))
    assert [(c.ranks, getattr(c, field)) for c in classes] == [((0,), None), ((1,), 5.0)]
    assert len(worker_classes(_with_overlap([5.0, 5.0], field))) == 1


@pytest.mark.parametrize("field", ["overlap_ms_per_mb", "overlap_ms_per_task"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), True, "1"])
def test_a_bad_overlap_cost_is_refused_naming_the_field(value: object, field: str) -> None:
    with pytest.raises(SpecError, match=field):
        _with_overlap([value, None], field)  # type: ignore[list-item]


def test_the_overlap_costs_survive_a_round_trip_through_yaml(tmp_path: Path) -> None:
    both = _with_overlap([None, 5.0]).to_dict()
    both["nodes"][0]["device"]["overlap_ms_per_task"] = 3.0
    Cluster.from_dict(both).save(tmp_path / "c.yaml")
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    assert cluster.worker_overlap_ms_per_mb() == (None, 5.0)
    assert cluster.worker_overlap_ms_per_task() == (3.0, None)


def test_a_transport_measured_apart_is_charged_its_own_cpu_work() -> None:
    # ps moves every layer by push and pull ("ps" transport): its own figures replace the general ones
    general = _iteration_ms("ps", cpu_per_task_ms=3.0, cpu_ms_per_mb=2.0)
    own = simulate(WORKLOAD, LINK, "ps", 6, 2, trace=False, options=SimOptions(
        cpu_per_task_ms=3.0, cpu_ms_per_mb=2.0, transport_cpu=(("ps", 0.0, 0.0),))).iteration_ms  # fmt: skip
    assert own == pytest.approx(_iteration_ms("ps"))  # nothing charged: as free as with no options
    assert general > own
    # a collective policy is untouched by an entry for another transport
    assert simulate(WORKLOAD, LINK, "wfbp", 6, 2, trace=False, options=SimOptions(
        cpu_per_task_ms=3.0, transport_cpu=(("ps", 0.0, 0.0),))).iteration_ms == _iteration_ms(
        "wfbp", cpu_per_task_ms=3.0)  # fmt: skip
    # the entry alone (no general charge) charges ps
    alone = simulate(WORKLOAD, LINK, "ps", 6, 2, trace=False,
                     options=SimOptions(transport_cpu=(("ps", 3.0, 2.0),))).iteration_ms  # fmt: skip
    assert alone == pytest.approx(general)


@pytest.mark.parametrize("entry", [("ps", -1.0, 0.0), ("ps", 0.0, float("nan")), (1, 0.0, 0.0), ("ps", 1.0)])
def test_bad_transport_cpu_entries_are_refused(entry: object) -> None:
    with pytest.raises(ScheduleError, match="transport_cpu"):
        SimOptions(transport_cpu=(entry,))  # type: ignore[arg-type]


def test_transport_cpu_from_json_lists_is_kept_as_tuples() -> None:
    assert SimOptions(transport_cpu=[["ps", 1, 2.5]]).transport_cpu == (("ps", 1, 2.5),)  # type: ignore[arg-type]
