"""Multi-device nodes in the packet fabric: a node switch on the intra link, one shared NIC."""

from __future__ import annotations

import pytest

from commsched.sim.packet import PacketConfig, TcpParams, build
from commsched.sim.packet.scenario import Flow, run_flows

from packet_builders import nodes

# 1000-byte segments without headers: 0.1 µs at the intra rate (80 Gbit/s), 1 µs at the NIC (8 Gbit/s)
TCP = TcpParams(segment_bytes=1000, header_bytes=0, initial_window_segments=10)
T_INTRA, T_NIC = 1000 / 10e9, 1000 / 1e9
L_INTRA, L_NIC = 2e-6, 10e-6


def _built(count: int, per_node: int, config: PacketConfig | None = None):  # type: ignore[no-untyped-def]
    config = config or PacketConfig(tcp=TCP)
    cluster = nodes(count, per_node, gbps=8.0, latency_us=10.0, intra_gbps=80.0, intra_latency_us=2.0)
    return build(cluster, config), config


def test_two_devices_of_one_node_talk_at_the_intra_rate_without_touching_the_nic() -> None:
    built, config = _built(2, 2)
    [one] = run_flows(built.fabric, [Flow(0, 1, 1000)], config)
    # one segment: serialised by the device and by the node switch (store and forward), then the intra latency
    assert one.fct_s == pytest.approx(2 * T_INTRA + L_INTRA, rel=1e-9)
    built, config = _built(2, 2)
    [four] = run_flows(built.fabric, [Flow(0, 1, 4000)], config)
    assert four.fct_s == pytest.approx(5 * T_INTRA + L_INTRA, rel=1e-9)  # pipelined: one more segment time
    ports = built.fabric.ports
    assert ports["w0>intra"].tx_bytes == 4000 and ports["w1<intra"].tx_bytes == 4000
    assert ports["n0>up"].tx_bytes == 0 and ports["n0<down"].tx_bytes == 0  # never the NIC, never the switch


def test_devices_of_one_node_share_its_nic_off_the_node() -> None:
    # 4 segments each: intra port, the node's NIC (8 Gbit/s), the switch port facing the other node, its intra port
    built, config = _built(2, 2)
    [alone] = run_flows(built.fabric, [Flow(0, 2, 4000)], config)
    assert alone.fct_s == pytest.approx(2 * T_INTRA + 5 * T_NIC + L_INTRA + L_NIC, rel=1e-9)
    built, config = _built(2, 2)
    both = run_flows(built.fabric, [Flow(0, 2, 4000), Flow(1, 3, 4000)], config)
    # the NIC serialises all 8 segments one after the other: the later flow ends 4 NIC segment times later
    assert max(r.fct_s for r in both) == pytest.approx(2 * T_INTRA + 9 * T_NIC + L_INTRA + L_NIC, rel=1e-9)
    assert min(r.fct_s for r in both) == pytest.approx(2 * T_INTRA + 8 * T_NIC + L_INTRA + L_NIC, rel=1e-9)
    assert built.fabric.ports["n0>up"].tx_bytes == 8000


def test_single_device_nodes_keep_one_port_to_the_switch_and_no_intra_ports() -> None:
    built, _ = _built(3, 1)
    assert sorted(built.fabric.ports) == ["w0<down", "w0>up", "w1<down", "w1>up", "w2<down", "w2>up"]


def test_a_message_waits_the_overhead_of_the_link_it_leaves_its_node_by() -> None:
    cluster = nodes(2, 2, overhead_us=30.0, intra_overhead_us=5.0)
    built = build(cluster, PacketConfig())
    assert built.message_overhead_s(0, 1) == pytest.approx(5e-6)
    assert built.message_overhead_s(1, 2) == pytest.approx(30e-6)
    assert built.node_of == (0, 0, 1, 1)


def test_a_leaf_holds_hosts_per_leaf_nics_and_a_node_switch_sits_below_its_leaf() -> None:
    built, _ = _built(4, 2, PacketConfig(topology="leaf_spine", hosts_per_leaf=2, spines=2, tcp=TCP))
    paths = built.fabric.paths
    assert [[p.name for p in path] for path in paths[(0, 2)]] == [["w0>intra", "n0>up", "n1<down", "w2<intra"]]
    assert [[p.name for p in path] for path in paths[(0, 4)]] == [
        ["w0>intra", "n0>up", f"leaf0>spine{k}", f"spine{k}>leaf1", "n2<down", "w4<intra"] for k in range(2)
    ]
    assert [[p.name for p in path] for path in paths[(6, 7)]] == [["w6>intra", "w7<intra"]]
