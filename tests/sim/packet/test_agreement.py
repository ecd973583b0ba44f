"""Flow level against packet level where they should agree: no loss, no priorities, one switch."""

from __future__ import annotations

import pytest

from commsched import zoo
from commsched.sim import simulate
from commsched.sim.packet import PacketConfig
from commsched.sim.packet.run import simulate_packet

from packet_builders import cluster, nodes, one_tensor


@pytest.mark.parametrize("policy", ["ddp", "dear"])
def test_flow_and_packet_level_iteration_times_agree_within_5_percent_without_loss(policy: str) -> None:
    """resnet18 on 4 hosts at 10 Gbit/s, 10 µs: measured +0.27 % (ddp) and +0.37 % (dear)."""
    workload = zoo.load("resnet18")
    c = cluster(4, gbps=10.0, latency_us=10.0)
    flow = simulate(workload, c, policy, iterations=3, warmup=1, trace=False)
    packet = simulate(workload, c, policy, iterations=3, warmup=1, options={"network": "packet"}, trace=False)
    assert packet.iteration_ms == pytest.approx(flow.iteration_ms, rel=0.05)
    assert packet.iteration_ms >= flow.iteration_ms  # headers and store and forward only add time


@pytest.mark.parametrize(("count", "per_node"), [(1, 4), (2, 2)])
def test_flow_and_packet_level_agree_within_5_percent_on_multi_device_nodes(count: int, per_node: int) -> None:
    """resnet18, ddp, 58 Gbit/s and 2 µs + 5 µs inside a node: measured +0.06 % (1 x 4) and +0.19 % (2 x 2)."""
    workload = zoo.load("resnet18")
    c = nodes(count, per_node, intra_gbps=58.0, intra_latency_us=2.0, intra_overhead_us=5.0)
    flow = simulate(workload, c, "ddp", iterations=3, warmup=1, trace=False)
    packet = simulate(workload, c, "ddp", iterations=3, warmup=1, options={"network": "packet"}, trace=False)
    assert packet.iteration_ms == pytest.approx(flow.iteration_ms, rel=0.05)


def _all_reduce_ms(config: PacketConfig, mib: int) -> tuple[float, float, int]:
    """One ``mib`` MiB all-reduce over 4 ranks (ring, 10 Gbit/s, 10 µs): flow ms, packet ms, packet timeouts."""
    workload = one_tensor(mib * 2**20)
    c = cluster(4, gbps=10.0, latency_us=10.0)
    flow = simulate(workload, c, "no_overlap", iterations=1, warmup=0, trace=False)
    run = simulate_packet(workload, c, "no_overlap", config, iterations=1, warmup=0, trace=False)
    timeouts = sum(int(row["timeouts"]) for row in run.network.flow_stats())
    return flow.exposed_comm_ms, run.result.exposed_comm_ms, timeouts


def test_a_large_all_reduce_costs_its_headers_over_the_flow_level_and_no_timeouts() -> None:
    # 16 MiB: 20.19 ms flow level, 20.47 ms packet level (+1.4 %: 52 B of headers per 8948 B segment on the
    # data and the ACKs sharing each NIC, and one segment time of store and forward per ring step)
    flow_ms, packet_ms, timeouts = _all_reduce_ms(PacketConfig(), 16)
    assert timeouts == 0
    assert flow_ms < packet_ms < 1.02 * flow_ms


def test_acks_queued_behind_a_hosts_own_data_fire_spurious_timeouts() -> None:
    # the same all-reduce with one FIFO per host NIC: each rank's ACKs wait behind its own growing window of
    # data, more than the 1 ms minimum RTO, so its predecessor times out and goes back N (measured +21 %)
    flow_ms, packet_ms, timeouts = _all_reduce_ms(PacketConfig(acks_first=False), 16)
    assert timeouts > 0
    assert packet_ms > 1.1 * flow_ms
