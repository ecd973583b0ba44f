from __future__ import annotations

import math

import pytest

from commsched.errors import SpecError
from commsched.formulas import (
    hierarchical_all_reduce_s,
    ps_push_pull_s,
    ring_all_gather_s,
    ring_all_reduce_s,
    ring_reduce_scatter_s,
    tree_all_reduce_s,
)
from commsched.sim.costs import CommModel

from sim_builders import make_cluster

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


def test_hierarchical_needs_equal_nodes_and_ps_needs_servers() -> None:
    with pytest.raises(SpecError, match="servers"):
        CommModel.from_cluster(make_cluster(4), "ps")
    uneven = make_cluster(4, per_node=2).model_copy(
        update={
            "nodes": (*make_cluster(4, per_node=2).nodes, make_cluster(1).nodes[0].model_copy(update={"name": "x"}))
        }
    )
    with pytest.raises(SpecError, match="equal devices per node"):
        CommModel.from_cluster(uneven, "hierarchical")
