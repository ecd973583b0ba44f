from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import pytest

from commsched.errors import ScheduleError, SpecError
from commsched.formulas import (
    hierarchical_all_reduce_s,
    ps_colocated_push_s,
    ps_push_pull_s,
    ps_push_s,
    ring_all_gather_s,
    ring_all_reduce_s,
    ring_reduce_scatter_s,
    tree_all_reduce_s,
)
from commsched.schedule import Action, CommPlan, Launch, Scheduler, scheduler_for
from commsched.schedule.fusion import make_task, whole
from commsched.schedule.knobs import NoKnobs
from commsched.sim import SimOptions, Simulation, costs, simulate
from commsched.sim.costs import CommModel, Phase, register_cost
from commsched.sim.simulator import plan_for

from sim_builders import make_cluster, make_workload

MB = 1e6


def test_ring_all_reduce_is_reduce_scatter_plus_all_gather() -> None:
    for p in (2, 3, 64):
        rs = ring_reduce_scatter_s(MB, p, 5e-6, 1e9)
        ag = ring_all_gather_s(MB, p, 5e-6, 1e9)
        assert ring_all_reduce_s(MB, p, 5e-6, 1e9) == pytest.approx(rs + ag)


def test_ring_all_reduce_matches_the_textbook_numbers() -> None:
    # 64 ranks, 100 MB, 55 us per step, 1.25 GB/s: 126 · 55 us + 2 · 63/64 · 0.08 s
    assert ring_all_reduce_s(100 * MB, 64, 55e-6, 1.25e9) == pytest.approx(126 * 55e-6 + 2 * 63 / 64 * 0.08)
    assert ring_all_reduce_s(100 * MB, 1, 55e-6, 1.25e9) == 0.0


def test_tree_latency_grows_with_log_p() -> None:
    assert tree_all_reduce_s(0.0, 64, 1e-5, 1e9) == pytest.approx(12e-5)
    assert tree_all_reduce_s(0.0, 65, 1e-5, 1e9) == pytest.approx(14e-5)


def test_ps_is_limited_by_server_incast_when_servers_are_few() -> None:
    # 8 workers, 2 servers: each server receives 4 n; worker side only n
    assert ps_push_pull_s(MB, 8, 2, 0.0, 1e9, 1e9) == pytest.approx(2 * 4 * MB / 1e9)
    assert ps_push_pull_s(MB, 8, 8, 0.0, 1e9, 1e9) == pytest.approx(2 * MB / 1e9)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_phases_add_up_to_the_closed_forms(algorithm: str, kind: str) -> None:
    cluster = make_cluster(8, gbps=10, latency_us=20, overhead_us=5, per_node=4, intra_gbps=60, intra_latency_us=3)
    model = CommModel.from_cluster(cluster, algorithm)
    nbytes = 3 * MB
    nic_bw, intra_bw = 10e9 / 8, 60e9 / 8
    ring_alpha = 25e-6  # max over the links a flat ring crosses
    if algorithm == "hierarchical":
        expected = {
            "all_reduce": hierarchical_all_reduce_s(nbytes, 2, 4, 3e-6, intra_bw, 25e-6, nic_bw),
            "reduce_scatter": ring_reduce_scatter_s(nbytes, 4, 3e-6, intra_bw)
            + ring_reduce_scatter_s(nbytes, 2, 25e-6, nic_bw),
        }
        expected["all_gather"] = expected["reduce_scatter"]
    else:
        expected = {
            "all_reduce": (tree_all_reduce_s if algorithm == "tree" else ring_all_reduce_s)(
                nbytes, 8, ring_alpha, nic_bw
            ),
            "reduce_scatter": ring_reduce_scatter_s(nbytes, 8, ring_alpha, nic_bw),
            "all_gather": ring_all_gather_s(nbytes, 8, ring_alpha, nic_bw),
        }
    assert model.cost_s(kind, nbytes) == pytest.approx(expected[kind], rel=1e-12)


def test_ps_phases_add_up_to_push_pull() -> None:
    cluster = make_cluster(8, gbps=10, latency_us=30, servers=2)
    model = CommModel.from_cluster(cluster, "ps")
    bw = 10e9 / 8
    assert model.cost_s("all_reduce", MB) == pytest.approx(ps_push_pull_s(MB, 8, 2, 30e-6, bw, bw))
    assert model.cost_s("reduce_scatter", MB) == pytest.approx(model.cost_s("all_reduce", MB) / 2)


def test_network_estimate_reproduces_the_models_all_reduce_cost() -> None:
    cluster = make_cluster(8, gbps=10, latency_us=20, overhead_us=5, per_node=4)
    for algorithm in ("ring", "tree", "hierarchical"):
        model = CommModel.from_cluster(cluster, algorithm)
        estimate = model.estimate()
        for nbytes in (1e3, 1e6, 1e8):
            assert estimate.allreduce_s(nbytes) == pytest.approx(model.cost_s("all_reduce", nbytes), rel=1e-9)


def test_the_ring_uses_the_slowest_link_and_largest_per_message_cost() -> None:
    cluster = make_cluster(8, gbps=100, latency_us=2, overhead_us=4, per_node=4, intra_gbps=58, intra_latency_us=7)
    model = CommModel.from_cluster(cluster)
    assert model.bandwidth == pytest.approx(58e9 / 8)
    assert model.alpha_s == pytest.approx(7e-6)


def test_a_single_worker_communicates_for_free() -> None:
    model = CommModel.from_cluster(make_cluster(1))
    assert model.phases("all_reduce", MB) == ()
    assert math.isfinite(model.estimate().bandwidth_bytes_per_s)


def test_ps_without_servers_in_the_spec_puts_a_server_on_every_worker() -> None:
    # 8 workers, 2 nodes of 4: every worker keeps 1/8 and sends 7/8 over the ring's slowest link, one startup
    cluster = make_cluster(8, gbps=10, latency_us=20, overhead_us=5, per_node=4, intra_gbps=60, intra_latency_us=3)
    model = CommModel.from_cluster(cluster, "ps")
    ring = CommModel.from_cluster(cluster, "ring")
    assert model.servers == 8 and model.servers_on_workers
    assert model.cost_s("push", MB) == pytest.approx(ps_colocated_push_s(MB, 8, 25e-6, 10e9 / 8))
    assert model.cost_s("push", MB) == pytest.approx(25e-6 + 7 / 8 * MB / (10e9 / 8))
    assert model.cost_s("pull", MB) == model.cost_s("push", MB)
    # the bytes of a ring reduce-scatter, with one startup instead of p - 1
    assert model.transfer_s("push", MB) == pytest.approx(ring.transfer_s("reduce_scatter", MB))
    assert model.sent_bytes("push", MB) == model.sent_bytes("pull", MB) == pytest.approx(7 / 8 * MB)
    assert model.sent_bytes("all_reduce", MB) == pytest.approx(ring.sent_bytes("all_reduce", MB))
    assert ps_colocated_push_s(MB, 1, 25e-6, 1e9) == 0.0


def test_hierarchical_needs_equal_nodes() -> None:
    uneven = make_cluster(4, per_node=2).model_copy(
        update={
            "nodes": (*make_cluster(4, per_node=2).nodes, make_cluster(1).nodes[0].model_copy(update={"name": "x"}))
        }
    )
    with pytest.raises(SpecError, match="equal devices per node"):
        CommModel.from_cluster(uneven, "hierarchical")


def test_push_and_pull_under_ps_are_the_halves_of_a_push_pull() -> None:
    cluster = make_cluster(8, gbps=10, latency_us=30, servers=2)
    model = CommModel.from_cluster(cluster, "ps")
    bw = 10e9 / 8
    push, pull = model.phases("push", MB), model.phases("pull", MB)
    assert [p.resource for p in push] == ["ps_push"] and [p.resource for p in pull] == ["ps_pull"]
    assert model.cost_s("push", MB) == pytest.approx(ps_push_s(MB, 8, 2, 30e-6, bw, bw))
    assert model.cost_s("push", MB) + model.cost_s("pull", MB) == pytest.approx(ps_push_pull_s(MB, 8, 2, 30e-6, bw, bw))
    assert push + pull == model.phases("all_reduce", MB)
    assert model.sent_bytes("push", MB) == MB and model.sent_bytes("pull", MB) == 0.0


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
@pytest.mark.parametrize("kind", ["push", "pull"])
def test_push_and_pull_under_a_collective_algorithm_are_refused_naming_the_known_kinds(
    algorithm: str, kind: str
) -> None:
    model = CommModel.from_cluster(make_cluster(8, per_node=4), algorithm)
    message = (
        f"no cost model for task kind '{kind}' under algorithm '{algorithm}'; "
        "known: all_reduce, reduce_scatter, all_gather"
    )
    for call in (model.phases, model.sent_bytes):
        with pytest.raises(ScheduleError, match=message):
            call(kind, MB)


def test_a_registered_cost_gives_an_algorithm_a_new_task_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(costs, "TASK_COSTS", dict(costs.TASK_COSTS))
    model = CommModel.from_cluster(make_cluster(4), "ring")
    with pytest.raises(ScheduleError, match="no cost model"):
        model.phases("push", MB)
    register_cost("ring", "push", lambda m, n: (Phase(m.alpha_s, "ring", n / m.bandwidth),), lambda m, n: n)
    assert model.cost_s("push", MB) == pytest.approx(MB / model.bandwidth)
    assert model.sent_bytes("push", MB) == MB


def test_a_plan_of_push_and_pull_tasks_runs_under_ps_like_all_reduces() -> None:
    """One push and one pull per tensor, the pull after its push: the network sees push, pull, push, ... ."""
    workload = make_workload([2.0, 3.0, 1.0], [4.0, 2.0, 3.0], [300_000, 200_000, 500_000])
    cluster = make_cluster(4, gbps=10, latency_us=20, servers=2)
    estimate = CommModel.from_cluster(cluster, "ps").estimate()
    tensors = range(len(workload.tensors))
    tasks = []
    for t in tensors:
        tasks.append(make_task(workload, 2 * t, "push", whole(workload, [t]), f"push{t}"))
        tasks.append(make_task(workload, 2 * t + 1, "pull", whole(workload, [t]), f"pull{t}", deps=(2 * t,)))
    plan = CommPlan("pushpull", workload, estimate, tuple(tasks), "step", NoKnobs())

    class PushPull(Scheduler):
        name: ClassVar[str] = "pushpull"

        def on_grad_ready(self, tensor: int) -> Sequence[Action]:
            return [Launch(2 * tensor), Launch(2 * tensor + 1)]

    options = SimOptions(algorithm="ps")
    sim = Simulation(
        workload, cluster, PushPull(plan), 3, 1, options, CommModel.from_cluster(cluster, "ps"), record_trace=False
    )
    sim.run()
    result = sim.result({}, 0.0)
    reference = simulate(workload, cluster, "wfbp", 3, 1, options=options, trace=False)  # one all-reduce per tensor
    assert result.iteration_ms == pytest.approx(reference.iteration_ms)
    assert result.gradient_bytes == reference.gradient_bytes == workload.total_bytes  # a push-pull pair counts once
    assert result.sent_bytes_per_worker == reference.sent_bytes_per_worker
    with pytest.raises(ScheduleError, match="no cost model for task kind 'push' under algorithm 'ring'"):
        Simulation(workload, cluster, PushPull(plan), 3, 1, SimOptions(), CommModel.from_cluster(cluster))


@pytest.mark.parametrize("servers", [0, 2], ids=["server_on_every_worker", "two_dedicated_servers"])
def test_the_ps_policy_simulates_its_pushes_and_pulls_under_the_ps_cost_model(servers: int) -> None:
    """Under the default (ring) algorithm, every task of a ``ps`` plan is priced by the ps model of the cluster."""
    workload = make_workload([2.0, 3.0, 1.0], [4.0, 2.0, 3.0], [300_000, 200_000, 500_000])
    cluster = make_cluster(4, gbps=10, latency_us=20, servers=servers)
    plan = plan_for(workload, cluster, "ps", partition_mb=0.5, credit_mb=1.0)
    assert {(t.kind, t.transport) for t in plan.tasks} == {("push", "ps"), ("pull", "ps")}
    sim = Simulation(workload, cluster, scheduler_for(plan), 3, 1, SimOptions(), CommModel.from_cluster(cluster))
    sim.run()
    ps = CommModel.from_cluster(cluster, "ps")
    assert ps.servers_on_workers == (servers == 0)
    assert sim.phases == [ps.phases(t.kind, t.bytes) for t in plan.tasks]
    result = sim.result({}, 0.0)
    sent = sum(ps.sent_bytes(t.kind, t.bytes) for t in plan.tasks)
    assert result.sent_bytes_per_worker == pytest.approx(sent)
    assert result.gradient_bytes == workload.total_bytes  # a push-pull pair counts once
    assert result.trace is not None
    events = [e for e in result.trace.events if e.kind in ("push", "pull")]
    assert {e.kind for e in events} == {"push", "pull"}
    for event in events:  # alone or sharing the network: never faster than the closed form
        assert event.duration_s >= ps.cost_s(event.kind, event.bytes) * (1 - 1e-9)


def test_ps_is_planned_with_the_cpu_work_the_options_charge_as_the_runtime_that_measured_it_would() -> None:
    from commsched.schedule.ps import fuse_bytes
    from commsched.sim.options import measured_cpu

    workload = make_workload([1.0] * 6, [1.0] * 6, [600_000, 40_000, 600_000, 90_000, 600_000, 120_000])
    cluster = make_cluster(2, gbps=10, latency_us=20)
    options = SimOptions(cpu_per_task_ms=0.05, cpu_ms_per_mb=0.5, transport_cpu=(("ps", 0.4, 1.0),))
    network = options.planned_with(CommModel.from_cluster(cluster).estimate())
    assert network.cpu_per_message_s == pytest.approx(0.05e-3)
    assert network.cpu_s_per_byte == pytest.approx(0.5e-3 / 2**20)
    assert network.transport_cpu == (("ps", pytest.approx(0.4e-3), pytest.approx(1e-3 / 2**20)),)
    back = measured_cpu(network)  # its inverse gives the options' CPU costs again
    assert back["cpu_per_task_ms"] == pytest.approx(0.05) and back["cpu_ms_per_mb"] == pytest.approx(0.5)
    assert back["transport_cpu"] == (("ps", pytest.approx(0.4), pytest.approx(1.0)),)
    assert fuse_bytes(None, network) > 4 * 120_000  # about 1.25 GB/s x 0.42 ms: each small tensor joins one
    unfused, fused = (
        [t.tensors for t in plan_for(workload, cluster, "ps", opts).tasks if t.kind == "push"]
        for opts in (None, options)
    )
    assert unfused == [(0,), (1,), (2,), (3,), (4,), (5,)]  # 20 us at 10 Gbit/s: the 64 KiB floor
    assert fused == [(0, 1), (2, 3), (4, 5)]
