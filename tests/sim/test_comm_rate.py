"""A device that slows transfers while it computes (``overlap_comm_rate``): collectives beside its compute."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsched.cluster import Cluster, load_cluster
from commsched.errors import SpecError
from commsched.sim import SimOptions, simulate
from commsched.sim.compute import worker_classes

from sim_builders import make_cluster, make_workload

# Three layers of 1 MiB each (fp32): backward 10 ms per layer, forward 5 ms; wfbp all-reduces each layer's
# MiB as its gradient is ready, 8.39 ms each on 2 ranks at 1 Gbit/s, one at a time.
WORKLOAD = make_workload([5.0, 5.0, 5.0], [10.0, 10.0, 10.0], [2**18, 2**18, 2**18])
LINK = make_cluster(2, gbps=1.0)
FREE_MS = 8.39


def _with_rates(rates: list[object]) -> Cluster:
    spec = LINK.to_dict()
    nodes = [
        {**node, "device": {**node["device"], **({} if rate is None else {"overlap_comm_rate": rate})}}
        for node, rate in zip(spec["nodes"], rates, strict=True)
    ]
    return Cluster.from_dict({**spec, "nodes": nodes})


def _all_reduce_ms(cluster: Cluster, policy: str = "wfbp") -> dict[str, float]:
    result = simulate(WORKLOAD, cluster, policy, 6, 2, options=SimOptions(), trace=True)
    assert result.trace is not None
    events = [e for e in result.trace.events if e.iteration == 3 and e.worker == 0 and e.kind == "all_reduce"]
    return {e.task: e.duration_s * 1e3 for e in events}


def test_a_collective_beside_a_slowing_devices_compute_keeps_its_share_of_the_rate_until_the_compute_ends() -> None:
    free = _all_reduce_ms(LINK)
    assert free == {name: pytest.approx(FREE_MS, abs=0.01) for name in ("l2.t0", "l1.t0", "l0.t0")}
    slowed = _all_reduce_ms(_with_rates([None, 0.5]))
    # l2's starts with 20 ms of rank 1's backward left: done inside it at half rate, 2 x 8.39 ms;
    # l1's waits for that slot and starts with 30 - 26.78 = 3.22 ms left: 3.22 + 8.39 - 0.5 x 3.22;
    # l0's starts after the backward: its own time
    assert slowed["l2.t0"] == pytest.approx(2 * free["l2.t0"], rel=1e-6)
    left = 30.0 - (10.0 + slowed["l2.t0"])
    assert slowed["l1.t0"] == pytest.approx(left + free["l1.t0"] - 0.5 * left, rel=1e-6)
    assert slowed["l0.t0"] == pytest.approx(free["l0.t0"], rel=1e-6)
    assert _all_reduce_ms(_with_rates([1.0, 1.0])) == free  # a rate of 1: nothing slows


def test_collectives_while_every_worker_waits_keep_their_rate() -> None:
    # no_overlap: one bucket after the backward, while the workers wait
    assert _all_reduce_ms(_with_rates([0.3, 0.3]), "no_overlap") == _all_reduce_ms(LINK, "no_overlap")


def test_ranks_with_different_comm_rates_are_simulated_apart() -> None:
    classes = worker_classes(_with_rates([None, 0.5]))
    assert [(c.ranks, c.overlap_comm_rate) for c in classes] == [((0,), None), ((1,), 0.5)]
    assert len(worker_classes(_with_rates([0.5, 0.5]))) == 1


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, float("nan"), True, "0.5"])
def test_a_comm_rate_outside_0_to_1_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(SpecError, match="overlap_comm_rate"):
        _with_rates([value, None])


def test_the_comm_rate_survives_a_round_trip_through_yaml(tmp_path: Path) -> None:
    _with_rates([None, 0.62]).save(tmp_path / "c.yaml")
    assert load_cluster(str(tmp_path / "c.yaml")).worker_overlap_comm_rate() == (None, 0.62)
