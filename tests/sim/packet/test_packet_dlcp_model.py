"""DLCP and background flows inside a training simulation on the packet network."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commsched.errors import SpecError
from commsched.sim import simulate
from commsched.sim.packet import PacketConfig, RedParams
from commsched.sim.packet.background import DISTRIBUTIONS, background_flows, mean_bytes, sample_sizes
from commsched.sim.packet.run import simulate_packet
from commsched.workload import NormHistogram, Workload

from packet_builders import cluster


def _two_layers(with_norms: bool) -> Workload:
    """Two layers of 1 MB of gradients each; the second with a histogram of its chunk norms if asked."""
    hist = {"chunk_numel": 2226, "edges": [0.0, 1.0, 10.0], "counts": [90, 10]} if with_norms else None
    layers = [
        {"name": f"l{i}", "tensors": [{"name": f"w{i}", "numel": 250_000}], "forward_ms": 0.2, "backward_ms": 0.4}
        | ({"grad_norms": hist} if hist and i == 1 else {})
        for i in range(2)
    ]
    return Workload.from_dict(
        {"model": "two", "batch_size": 8, "device": "test", "layers": layers,
         "provenance": {"kind": "estimated", "source": "test"}}
    )  # fmt: skip


def test_dlcp_tasks_run_on_dlcp_and_only_the_flow_level_marks_them_unvalidated() -> None:
    workload, hosts = _two_layers(with_norms=False), cluster(3)
    config = PacketConfig(transport="dctcp", red=RedParams(), priority_classes=3)
    run = simulate_packet(workload, hosts, "dlcp", config, 2, 1, loss_bound=0.05)
    stats = run.network.dlcp_stats()
    assert run.result.unvalidated is None
    assert stats["messages"] > 0 and stats["max_lost_fraction"] <= 0.05
    assert not run.network.connections  # nothing went over TCP
    assert simulate(workload, hosts, "dlcp", 2, 1, loss_bound=0.05).unvalidated is not None
    ps_mode = simulate_packet(workload, hosts, "dlcp", config, 2, 1, mode="ps")
    senders = {src for src, _ in ps_mode.network.dlcp_connections}
    receivers = {dst for _, dst in ps_mode.network.dlcp_connections}
    assert senders == {0, 1, 2} and receivers == {0, 1, 2}  # pushes to rank 0, pulls from it
    assert all(0 in pair for pair in ps_mode.network.dlcp_connections)


def test_recorded_magnitudes_reach_the_packets_and_say_what_a_loss_cost() -> None:
    workload, hosts = _two_layers(with_norms=True), cluster(3)
    config = PacketConfig(transport="dctcp", red=RedParams(min_bytes=20_000, max_bytes=20_000), priority_classes=3)
    run = simulate_packet(workload, hosts, "dlcp", config, 2, 1, loss_bound=0.2)
    records = [r for conn in run.network.dlcp_connections.values() for r in conn.receiver.records]
    assert any(not math.isnan(share) for *_, share in records)  # layer 1 has a histogram
    lossy = [(lost / numel, share) for numel, lost, _, share in records if lost and not math.isnan(share)]
    # the lost packets are the unimportant (small) ones: they carry less of the norm than of the elements
    assert lossy and all(share < fraction for fraction, share in lossy)


def test_background_sizes_follow_the_distribution_and_arrivals_the_load() -> None:
    rng = np.random.default_rng(0)
    for name, points in DISTRIBUTIONS.items():
        sizes = sample_sizes(name, rng, 40_000)
        for size, cdf in points[1:-1]:
            assert abs(np.mean(sizes <= size) - cdf) < 0.01, (name, size)
    flows = background_flows(list(range(8)), 0.4, 10.0, "web_search", 0.5, seed=3)
    expected = 0.4 * 8 * 10e9 / 8 * 0.5 / mean_bytes("web_search")
    assert abs(len(flows) - expected) < 4 * math.sqrt(expected)
    assert all(f.src != f.dst and 0 <= f.start_s < 0.5 for f in flows)
    assert flows == background_flows(list(range(8)), 0.4, 10.0, "web_search", 0.5, seed=3)
    assert flows != background_flows(list(range(8)), 0.4, 10.0, "web_search", 0.5, seed=4)


def test_background_flows_share_the_fabric_with_a_training_job_and_end_with_it() -> None:
    workload, hosts = _two_layers(with_norms=False), cluster(4)
    quiet = simulate_packet(workload, hosts, "ps", PacketConfig(transport="dctcp", red=RedParams()), 3, 1)
    config = PacketConfig(
        transport="dctcp", red=RedParams(), background_load=0.5, background="web_search", background_duration_s=0.01
    )
    busy = simulate_packet(workload, hosts, "ps", config, 3, 1)
    assert busy.network.background_fcts and all(fct > 0 for _, fct in busy.network.background_fcts)
    assert busy.result.iteration_ms > quiet.result.iteration_ms


def test_with_background_traffic_the_job_keeps_out_of_the_last_band() -> None:
    workload, hosts = _two_layers(with_norms=False), cluster(3)
    for load, bands in ((0.0, {0, 1}), (0.5, {0})):  # two layers: two priorities, over both bands or the first
        config = PacketConfig(transport="dctcp", priority_classes=2, background_load=load, background_duration_s=0.002)
        run = simulate_packet(workload, hosts, "ps", config, 1, 0, trace=False)
        assert {cls for _, _, cls in run.network.connections} == bands


def test_a_norm_histogram_is_optional_and_checked() -> None:
    old = _two_layers(with_norms=False)
    assert old.layers[1].grad_norms is None and "grad_norms" not in old.to_json()
    new = _two_layers(with_norms=True)
    assert Workload.from_json(new.to_json()) == new
    hist = new.layers[1].grad_norms
    assert isinstance(hist, NormHistogram) and hist.counts == (90, 10)
    with pytest.raises(SpecError, match="edges"):
        bad = {"chunk_numel": 1, "edges": [0, 1], "counts": [1, 2]}
        Workload.from_dict(new.model_dump() | {"layers": [new.layers[0].model_dump() | {"grad_norms": bad}]})


@pytest.mark.parametrize("policy", ["ps", "dlcp"])
def test_every_message_between_hosts_has_its_completion_time_and_iteration(policy: str) -> None:
    workload, hosts = _two_layers(with_norms=False), cluster(3)
    run = simulate_packet(workload, hosts, policy, PacketConfig(transport="dctcp"), 2, 1, trace=False)
    fcts = run.network.message_fcts
    launches = {launch for launch, _, _ in fcts}
    assert launches >= {0, 1, 2}  # the warm-up iteration and the two measured ones
    per_launch = [sum(1 for launch, _, _ in fcts if launch == n) for n in sorted(launches)]
    assert len(set(per_launch[:3])) == 1  # every iteration moves the same messages
    assert all(nbytes > 0 and fct_s > 0 for _, nbytes, fct_s in fcts)
