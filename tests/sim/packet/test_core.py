from __future__ import annotations

import pytest

from commsched.sim.packet import PacketConfig, TcpParams
from commsched.sim.packet.fabric import Packet
from commsched.sim.packet.scenario import Flow, run_flows

from packet_builders import fabric


def test_one_segment_on_an_idle_path_takes_serialisation_plus_propagation_exactly() -> None:
    # one segment, no handshake: it crosses the sender's NIC and the switch port (store and forward)
    tcp = TcpParams(segment_bytes=1000, header_bytes=50)
    config = PacketConfig(tcp=tcp)
    fab = fabric(2, config, gbps=8.0, latency_us=10.0)
    [result] = run_flows(fab, [Flow(0, 1, 1000)], config)
    wire_s = 1050 / 1e9  # 8 Gbit/s = 1e9 bytes/s
    assert result.fct_s == pytest.approx(2 * wire_s + 10e-6, rel=1e-12)


def test_a_flow_within_the_initial_window_is_pipelined_store_and_forward() -> None:
    # 4 segments back to back: the last leaves the NIC at 4·t and the switch one t later
    tcp = TcpParams(segment_bytes=1000, header_bytes=0, initial_window_segments=10)
    config = PacketConfig(tcp=tcp)
    fab = fabric(2, config, gbps=8.0, latency_us=2.0)
    [result] = run_flows(fab, [Flow(0, 1, 4000)], config)
    assert result.fct_s == pytest.approx(5 * 1e-6 + 2e-6, rel=1e-12)


def test_bytes_sent_equal_bytes_received_plus_dropped() -> None:
    # 8 -> 1 incast into a small buffer: drops happen, and every injected byte is accounted for
    config = PacketConfig(buffer_bytes=60_000, tcp=TcpParams(segment_bytes=1448, header_bytes=52))
    fab = fabric(9, config)
    results = run_flows(fab, [Flow(s, 8, 400_000) for s in range(8)], config)
    assert sum(r.drops for r in results) > 0
    assert fab.injected_bytes == fab.delivered_bytes + fab.dropped_bytes
    assert sum(p.drops for p in fab.ports.values()) == sum(r.drops for r in results)


def test_the_same_seed_gives_the_same_run_and_another_seed_another_spray() -> None:
    def run(seed: int) -> list[float]:
        config = PacketConfig(
            topology="leaf_spine", hosts_per_leaf=2, load_balancing="spray", buffer_bytes=40_000, seed=seed
        )
        fab = fabric(4, config)
        return [
            r.fct_s for r in run_flows(fab, [Flow(0, 2, 500_000), Flow(1, 3, 500_000), Flow(3, 0, 300_000)], config)
        ]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_packet_events_and_timers_run_in_one_time_then_scheduling_order() -> None:
    # two heaps, one order: by time, and at equal times in the order they were scheduled, whichever heap
    fab = fabric(2, PacketConfig())
    ran: list[str] = []
    events = [(3e-6, "p"), (1e-6, "t"), (1e-6, "p"), (2e-6, "t"), (1e-6, "t"), (3e-6, "t"), (2e-6, "p"), (5e-6, "p")]
    for i, (time_s, kind) in enumerate(events):
        schedule = fab.schedule if kind == "p" else fab.schedule_timer
        schedule(time_s, ran.append, f"{kind}{i}")
    assert fab.peek() == 1e-6
    fab.run(until=3e-6)
    expected = [f"{kind}{i}" for i, (_, kind) in sorted(enumerate(events), key=lambda e: (e[1][0], e[0]))]
    assert ran == expected[:-1]  # the one at 5 µs is after `until`
    assert fab.now == 3e-6 and fab.peek() == 5e-6
    fab.run()
    assert ran == expected and fab.peek() == float("inf")


def test_a_timer_scheduled_while_running_runs_before_a_later_packet_event() -> None:
    fab = fabric(2, PacketConfig())
    ran: list[str] = []
    fab.schedule(1e-6, lambda _: fab.schedule_timer(2e-6, ran.append, "timer"), None)
    fab.schedule(3e-6, ran.append, "packet")
    fab.run(stop=lambda: len(ran) == 1)
    assert ran == ["timer"] and fab.now == 2e-6


def test_a_port_is_busy_for_its_merged_transmissions_within_a_window() -> None:
    # two back-to-back packets make one period, a third after a gap another; the window clips both
    fab = fabric(2, PacketConfig())
    port = fab.hosts[0].nic
    assert port is not None
    for when, size in ((0.0, 1250), (1e-6, 1250), (5e-6, 2500)):  # 10 Gbit/s: 1 µs per 1250 bytes
        fab.now = when
        port._transmit(Packet(0, size, size, when), when)
    assert list(port.busy_lo) == [0.0, 5e-6] and list(port.busy_hi) == pytest.approx([2e-6, 7e-6])
    assert port.busy_within(1e-6, 6e-6) == pytest.approx(2e-6)
    assert port.busy_within(0.0, 1.0) == pytest.approx(4e-6)
