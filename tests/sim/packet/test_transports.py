from __future__ import annotations

import pytest

from commsched.sim.packet import TRANSPORTS, Packet, PacketConfig, RedParams, TcpParams
from commsched.sim.packet.newreno import TcpSender
from commsched.sim.packet.registry import register_transport
from commsched.sim.packet.scenario import Flow, run_flows

from packet_builders import fabric

TCP = TcpParams(segment_bytes=1448, header_bytes=52)


def test_dctcp_keeps_the_incast_queue_near_k_without_drops_where_newreno_overflows() -> None:
    k = 30_000
    dctcp = PacketConfig(
        transport="dctcp", red=RedParams(min_bytes=k, max_bytes=k), buffer_bytes=150_000, tcp=TCP, record_queues=True
    )
    fab = fabric(9, dctcp)
    results = run_flows(fab, [Flow(s, 8, 2_000_000) for s in range(8)], dctcp)
    assert sum(r.drops for r in results) == 0 and sum(r.marks for r in results) > 0
    port = fab.ports["w8<down"]
    assert port.samples is not None
    assert max(q for _, q in port.samples) < 150_000
    reno = PacketConfig(transport="tcp", buffer_bytes=150_000, tcp=TCP)
    fab = fabric(9, reno)
    assert sum(r.drops for r in run_flows(fab, [Flow(s, 8, 2_000_000) for s in range(8)], reno)) > 0


def test_pfabric_lets_a_short_flow_through_a_long_one() -> None:
    config = PacketConfig(transport="pfabric", pfabric=True, buffer_bytes=60_000, tcp=TCP)
    alone = run_flows(fabric(3, config), [Flow(1, 2, 50_000)], config)[0]
    fab = fabric(3, config)
    _long, short = run_flows(fab, [Flow(0, 2, 5_000_000), Flow(1, 2, 50_000, start_s=100e-6)], config)
    assert short.fct_s < 1.3 * alone.fct_s
    fifo = PacketConfig(transport="tcp", buffer_bytes=60_000, tcp=TCP)
    _, short_fifo = run_flows(fabric(3, fifo), [Flow(0, 2, 5_000_000), Flow(1, 2, 50_000, start_s=100e-6)], fifo)
    assert short.fct_s < short_fifo.fct_s


def test_a_transport_is_added_by_registering_a_factory() -> None:
    register_transport("tcp-copy", TRANSPORTS["tcp"])
    try:
        config = PacketConfig(transport="tcp-copy", tcp=TCP)
        [result] = run_flows(fabric(2, config), [Flow(0, 1, 100_000)], config)
        assert result.fct_s > 0
    finally:
        del TRANSPORTS["tcp-copy"]


def _ack(ack: int, now_s: float, ts_echo: float) -> Packet:
    return Packet(0, 0, 52, now_s, is_ack=True, ack=ack, ts_echo=ts_echo)


def test_only_acks_that_advance_una_give_rtt_samples() -> None:
    # RFC 7323's RTTM rule: a duplicate ACK echoing an old timestamp says nothing about the path's RTT
    sender = TcpSender(TcpParams(segment_bytes=1000, initial_window_segments=4))
    out: list[Packet] = []
    sender.push(4000, 0.0, out)
    sender.on_ack(_ack(1, 100e-6, 0.0), 100e-6, out)
    assert sender.srtt == pytest.approx(100e-6)
    sender.on_ack(_ack(1, 900e-6, 0.0), 900e-6, out)  # a duplicate, 900 µs after the echoed segment left
    assert sender.srtt == pytest.approx(100e-6) and sender.dupacks == 1


def test_a_second_timeout_of_the_same_segment_keeps_ssthresh() -> None:
    # RFC 5681: ssthresh is held constant when the timer resends a segment it already resent
    sender = TcpSender(TcpParams(segment_bytes=1000, initial_window_segments=10, min_rto_s=1e-3))
    out: list[Packet] = []
    sender.push(10_000, 0.0, out)
    sender.on_timer(sender.timer_s, out)
    assert (sender.ssthresh, sender.cwnd, sender.timeouts) == (5.0, 1.0, 1)
    sender.on_timer(sender.timer_s, out)  # no ACK came back: backed off, ssthresh unchanged
    assert (sender.ssthresh, sender.timeouts) == (5.0, 2)
    sender.on_ack(_ack(1, 5e-3, 4e-3), 5e-3, out)
    sender.on_timer(sender.timer_s, out)  # una advanced since: a new loss event sets ssthresh again
    assert sender.ssthresh == 2.0 and sender.timeouts == 3
