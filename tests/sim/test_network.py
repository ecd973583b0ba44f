from __future__ import annotations

import pytest

from commsched.errors import ScheduleError
from commsched.schedule import build_scheduler
from commsched.sim import SimOptions, Simulation, simulate
from commsched.sim.costs import CommModel, Phase
from commsched.sim.engine import EventLoop
from commsched.sim.network import NETWORK_MODELS, Collective, Network, NetworkContext, SharedLink, flow_network

from sim_builders import make_cluster, make_workload


def test_two_equal_transfers_sharing_a_link_both_take_twice_as_long() -> None:
    loop = EventLoop()
    link = SharedLink(loop, "l")
    done: dict[str, float] = {}
    link.add(1.0, lambda: done.__setitem__("a", loop.now))
    link.add(1.0, lambda: done.__setitem__("b", loop.now))
    loop.run()
    assert done == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}


def test_a_late_joiner_slows_the_transfer_in_flight_only_while_both_run() -> None:
    loop = EventLoop()
    link = SharedLink(loop, "l")
    done: dict[str, float] = {}
    link.add(2.0, lambda: done.__setitem__("a", loop.now))
    loop.schedule(1.0, lambda: link.add(0.5, lambda: done.__setitem__("b", loop.now)))
    loop.run()
    # a: 1 s alone, then shares: b needs 0.5 at rate 1/2 (1 s), a gets 0.5 meanwhile, then 0.5 alone
    assert done["b"] == pytest.approx(2.0)
    assert done["a"] == pytest.approx(2.5)
    assert link.busy_within(0.0, 10.0) == pytest.approx(2.5)
    assert link.served_s == pytest.approx(2.5)


def _run(max_concurrent: int) -> list[tuple[float, float]]:
    loop = EventLoop()
    finished: list[Collective] = []
    net = Network(loop, max_concurrent, finished.append)
    for task in range(3):
        net.ready(Collective(task, 0, (Phase(1.0, "ring", 1.0),), 0.0))
    loop.run()
    return [(c.start_s, c.end_s) for c in sorted(finished, key=lambda c: c.task)]


def test_one_channel_serialises_collectives_in_ready_order() -> None:
    assert _run(1) == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]


def test_concurrent_collectives_overlap_latency_and_share_bandwidth() -> None:
    # latencies overlap (all start at 0, transfer from 1 s), 3 transfers of 1 s share the link: all end at 4 s
    spans = _run(3)
    assert [s for s, _ in spans] == [0.0, 0.0, 0.0]
    assert [e for _, e in spans] == [pytest.approx(4.0)] * 3


def test_an_unknown_network_model_is_refused_naming_the_accepted_ones() -> None:
    assert SimOptions(network="packet").network == "packet"
    workload = make_workload([1.0, 1.0], [1.0, 1.0], [1000, 1000])
    with pytest.raises(ScheduleError, match=r"unknown network model \('fluid'\); network must be one of: flow, packet"):
        simulate(workload, make_cluster(2), "ddp", options={"network": "fluid"})
    assert SimOptions(network="flow").network == SimOptions().network == "flow"


def test_a_network_factory_replaces_the_flow_model_without_changing_the_simulator() -> None:
    """A model built by a factory sees every collective; wrapping the flow model changes nothing."""
    seen: list[NetworkContext] = []
    collectives: list[Collective] = []

    class Counting:
        def __init__(self, context: NetworkContext) -> None:
            seen.append(context)
            self.inner = flow_network(context)
            self.links = self.inner.links

        def ready(self, coll: Collective) -> None:
            collectives.append(coll)
            self.inner.ready(coll)

    workload = make_workload([1.0, 2.0, 1.0], [2.0, 1.0, 3.0], [200_000, 100_000, 300_000])
    cluster = make_cluster(4, 8.0, 5.0)
    scheduler = build_scheduler("wfbp", workload, CommModel.from_cluster(cluster).estimate())
    comm = CommModel.from_cluster(cluster)
    sim = Simulation(workload, cluster, scheduler, 3, 1, SimOptions(), comm, network=Counting)
    sim.run()
    result = sim.result({}, 0.0)
    reference = simulate(workload, cluster, "wfbp", 3, 1)
    assert result.iteration_ms == reference.iteration_ms
    assert result.link_utilisation == reference.link_utilisation
    assert len(seen) == 1 and seen[0].tasks == scheduler.plan.tasks and seen[0].cluster is cluster
    assert len(collectives) == (3 + 1) * len(scheduler.plan.tasks)  # every task of every iteration, warm-up included
    assert all(c.end_s >= c.start_s >= c.ready_s for c in collectives)


def test_flow_is_the_network_model_sim_options_select_by_default() -> None:
    assert NETWORK_MODELS[SimOptions().network] is flow_network
