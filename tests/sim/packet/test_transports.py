from __future__ import annotations

from commsched.sim.packet import TRANSPORTS, PacketConfig, RedParams, TcpParams
from commsched.sim.packet.scenario import Flow, run_flows
from commsched.sim.packet.transport import register_transport

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
