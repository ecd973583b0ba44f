"""DLCP in the packet network: the real link's state machines, driven by fabric events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from commsched.sim.packet import PacketConfig, RedParams
from commsched.sim.packet.config import DlcpParams
from commsched.sim.packet.connection import Connection
from commsched.sim.packet.dlcp import DlcpReceiver, DlcpSender, band_of
from commsched.sim.packet.fabric import Fabric, Packet
from commsched.sim.packet.registry import TRANSPORTS, register_transport
from commsched.sim.packet.scenario import Flow, run_flows
from commsched.sim.packet.transport import MessageSpec
from commsched.transport.dlcp import protocol, rate
from commsched.transport.dlcp import sender as sender_module
from commsched.transport.dlcp.protocol import LAYER_DSCP, tos_byte
from commsched.transport.dlcp.wire import packet_numel

from packet_builders import fabric

DLCP = PacketConfig(transport="dlcp")
STRIDE = packet_numel(DLCP.tcp.segment_bytes + DLCP.tcp.header_bytes, 4)  # float32 elements per full DATA datagram


def _one(config: PacketConfig, spec: MessageSpec, nbytes: int) -> tuple[Fabric, DlcpSender, DlcpReceiver, float]:
    """One DLCP message from host 0 to host 1; returns the fabric, both halves and the completion time."""
    fab = fabric(2, config)
    sender, receiver = TRANSPORTS["dlcp"](config, 0)
    assert isinstance(sender, DlcpSender) and isinstance(receiver, DlcpReceiver)
    conn = Connection(fab, 0, 1, 0, sender, receiver, 0)
    end = [-1.0]
    conn.message(nbytes, lambda: end.__setitem__(0, fab.now), spec)
    fab.run()
    return fab, sender, receiver, end[0]


def test_the_simulator_drives_the_links_own_state_machines() -> None:
    sender, receiver = TRANSPORTS["dlcp"](DLCP, 0)
    assert isinstance(sender.rate, rate.RateControl)  # type: ignore[attr-defined]
    assert isinstance(receiver.feedback, protocol.PeerFeedback)  # type: ignore[attr-defined]
    out: list[Packet] = []
    sender.push(100_000, 0.0, out)
    [transfer] = sender.transfers  # type: ignore[attr-defined]
    assert type(transfer.send) is sender_module.SenderState and type(transfer.recv) is protocol.ReceiverState


def test_zero_loss_bound_is_exact_and_needs_no_stop_before_every_element() -> None:
    _, sender, receiver, fct = _one(DLCP, MessageSpec(loss_bound=0.0), 1_000_000)
    [(numel, lost, ended, _)] = receiver.records
    assert fct > 0 and lost == 0 and ended == "complete" and numel == 250_000
    assert sender.transfers == []  # STOP reached the sender


class TapSender:
    """A DlcpSender whose outgoing DATA datagrams pass ``keep(pkt)`` (else they are lost on the wire)."""

    def __init__(self, inner: DlcpSender, keep: Callable[[Packet], bool]) -> None:
        self.inner, self.keep, self.sent_ect = inner, keep, {}

    @property
    def timer_s(self) -> float:
        return self.inner.timer_s

    def _filter(self, out: list[Packet], start: int) -> None:
        kept = []
        for pkt in out[start:]:
            if pkt.payload_bytes and not pkt.is_ack:
                self.sent_ect[pkt.seq] = pkt.ect
                if not self.keep(pkt):
                    continue
            kept.append(pkt)
        out[start:] = kept

    def push(self, nbytes: int, now_s: float, out: list[Packet], spec: MessageSpec | None = None) -> int:
        n = len(out)
        end = self.inner.push(nbytes, now_s, out, spec)
        self._filter(out, n)
        return end

    def on_ack(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        n = len(out)
        self.inner.on_ack(pkt, now_s, out)
        self._filter(out, n)

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        n = len(out)
        self.inner.on_timer(now_s, out)
        self._filter(out, n)


class TapReceiver:
    """A DlcpReceiver that notes the sequence numbers of the DATA datagrams it gets."""

    def __init__(self, inner: DlcpReceiver) -> None:
        self.inner, self.got = inner, set()

    timer_s = property(lambda self: self.inner.timer_s)
    rcv_nxt = property(lambda self: self.inner.rcv_nxt)
    completed = property(lambda self: self.inner.completed)

    def on_data(self, pkt: Packet, now_s: float, out: list[Packet]) -> None:
        if pkt.payload_bytes:
            self.got.add(pkt.seq)
        self.inner.on_data(pkt, now_s, out)

    def on_timer(self, now_s: float, out: list[Packet]) -> None:
        self.inner.on_timer(now_s, out)


@contextmanager
def tapped(keep: Callable[[Packet], bool] = lambda pkt: True) -> Iterator[PacketConfig]:
    """A config whose transport is DLCP with :class:`TapSender` / :class:`TapReceiver` around it."""

    def factory(config: PacketConfig, cls: int) -> tuple[Any, Any]:
        sender, receiver = TRANSPORTS["dlcp"](config, cls)
        assert isinstance(sender, DlcpSender) and isinstance(receiver, DlcpReceiver)
        return TapSender(sender, keep), TapReceiver(receiver)

    register_transport("dlcp-tap", factory)
    try:
        yield PacketConfig(transport="dlcp-tap")
    finally:
        del TRANSPORTS["dlcp-tap"]


def test_a_lossy_link_completes_at_the_bound_with_stop_and_never_loses_more() -> None:
    # every 7th datagram is lost on the wire: the sender's PROBE finds the holes within the bound, nothing re-sent
    bound = 0.2
    with tapped(lambda pkt: pkt.seq % 7 != 6) as config:
        [result] = run_flows(fabric(2, config), [Flow(0, 1, 2_000_000, loss_bound=bound)], config)
    [(numel, lost, ended, _)] = result.receiver.inner.records
    assert ended == "bound" and 0 < lost <= int(bound * numel)
    assert result.sender.inner.retransmits == 0 and result.sender.inner.transfers == []


def test_a_datagram_lost_in_mid_stream_is_resent_on_the_receivers_report_as_on_the_link() -> None:
    # the 10th datagram is lost on the wire; the PROBE is held off, so only a report can get it re-sent
    with tapped(lambda pkt: pkt.seq != 9) as config:
        config = replace(config, dlcp=DlcpParams(probe_delay_s=60.0))
        [result] = run_flows(fabric(2, config), [Flow(0, 1, 1_000_000)], config)
    sender = result.sender.inner
    [(_, lost, ended, _)] = result.receiver.inner.records
    assert (lost, ended) == (0, "complete") and result.fct_s < 1.0
    assert sender.retransmits == 1 and sender.probes == 0 and sender.transfers == []


def test_a_push_goes_before_a_pull_and_no_message_before_an_earlier_steps_as_on_the_link() -> None:
    fab = fabric(2, DLCP)
    sender, receiver = TRANSPORTS["dlcp"](DLCP, 0)
    conn = Connection(fab, 0, 1, 0, sender, receiver, 0)
    ends: dict[str, float] = {}
    conn.message(500_000, lambda: ends.setdefault("pull", fab.now), MessageSpec(priority=0, phase=1))
    conn.message(500_000, lambda: ends.setdefault("next", fab.now), MessageSpec(priority=0, phase=0, step=1))
    conn.message(500_000, lambda: ends.setdefault("push", fab.now), MessageSpec(priority=3, phase=0))
    fab.run()
    assert ends["push"] < ends["pull"] < ends["next"]


@pytest.mark.parametrize("stop_at_count", [False, True])
def test_a_loss_free_path_loses_nothing_unless_the_count_rule_stops_early(stop_at_count: bool) -> None:
    config = replace(DLCP, dlcp=DlcpParams(stop_at_count=stop_at_count))
    _, sender, receiver, _ = _one(config, MessageSpec(loss_bound=0.1), 1_000_000)
    [(numel, lost, ended, _)] = receiver.records
    if stop_at_count:  # MLT's rule: STOP once 1 - bound arrived, the last packets given up
        assert ended == "bound" and 0 < lost <= int(0.1 * numel) and sender.probes == 0
    else:  # the link's default: the bound only covers what the network lost
        assert ended == "complete" and lost == 0
    assert sender.transfers == []


def test_holes_beyond_the_bound_are_resent_after_a_probe() -> None:
    # the first pass loses every 4th packet (25 % > the 1 % bound): a PROBE, a BITMAP, the holes re-sent
    with tapped(lambda pkt: pkt.info[1].resend or pkt.info[1].offset // STRIDE % 4 != 0) as config:
        [result] = run_flows(fabric(2, config), [Flow(0, 1, 1_000_000, loss_bound=0.01)], config)
    sender = result.sender.inner
    [(numel, lost, _, _)] = result.receiver.inner.records
    assert sender.probes >= 1 and sender.retransmits >= 112 // 4 - 1
    assert lost <= int(0.01 * numel)


def test_importance_sets_ect_and_the_band_and_red_drops_only_the_unimportant() -> None:
    assert tos_byte(0, True) & 3 == protocol.ECT0 and tos_byte(0, False) & 3 == 0
    assert band_of(tos_byte(0, True), 5) == 0 and band_of(tos_byte(3, True), 5) == 3
    assert band_of(tos_byte(0, False), 5) == 4 and band_of(tos_byte(0, False), 1) == 0
    assert [band_of(d << 2 | 2, 3) for d in LAYER_DSCP] == [0, 1, 1, 1]
    # an incast through a RED port (layer class 1, so magnitudes decide): ECT packets are marked, the rest dropped
    with tapped() as tap:
        red = RedParams(min_bytes=30_000, max_bytes=30_000)
        config = replace(tap, red=red, priority_classes=2, buffer_bytes=8_000_000)  # never full: RED alone drops
        results = run_flows(fabric(5, config), [Flow(s, 4, 1_000_000, cls=1, loss_bound=0.5) for s in range(4)], config)
    lost_ect = lost_other = 0
    for r in results:
        for seq, ect in r.sender.sent_ect.items():
            if seq not in r.receiver.got:
                lost_ect += ect
                lost_other += not ect
    assert sum(r.drops for r in results) > 0 and sum(r.marks for r in results) > 0
    assert lost_other > 0 and lost_ect == 0


def test_magnitudes_decide_importance_through_classify() -> None:
    sender = DlcpSender(DLCP, 0)
    out: list[Packet] = []
    norms = np.arange(10, dtype=np.float64)
    sender.push(10 * STRIDE * 4, 0.0, out, MessageSpec(loss_bound=0.5, priority=2, norms=lambda stride, numel: norms))
    [transfer] = sender.transfers
    important = np.asarray(transfer.send._important)
    assert important.tolist() == [0] * 5 + [1] * 5  # the median and above
    first = [p for p in out if p.payload_bytes]
    assert first and first[0].ect and first[0].info[1].offset == 5 * STRIDE  # the important ones first, ECN-capable


def test_spraying_spreads_one_dlcp_message_over_every_spine() -> None:
    config = PacketConfig(transport="dlcp", topology="leaf_spine", hosts_per_leaf=2, spines=4)
    fab = fabric(4, config)
    run_flows(fab, [Flow(0, 3, 4_000_000)], config)
    carried = [fab.ports[f"leaf0>spine{k}"].tx_bytes for k in range(4)]
    assert min(carried) > 0.9 * max(carried)
    ecmp = PacketConfig(
        transport="dlcp", topology="leaf_spine", hosts_per_leaf=2, spines=4, dlcp=DlcpParams(spray=False)
    )
    fab = fabric(4, ecmp)
    run_flows(fab, [Flow(0, 3, 4_000_000)], ecmp)
    assert sum(fab.ports[f"leaf0>spine{k}"].tx_bytes > 0 for k in range(4)) == 1


def _incast(seed: int) -> tuple[list[float], Fabric]:
    config = PacketConfig(
        transport="dlcp", red=RedParams(min_bytes=60_000, max_bytes=60_000), buffer_bytes=200_000, seed=seed
    )
    fab = fabric(6, config)
    results = run_flows(fab, [Flow(s, 5, 800_000, cls=1, loss_bound=0.05) for s in range(5)], config)
    return [r.fct_s for r in results], fab


def test_same_seed_same_run_and_bytes_are_conserved_with_drops() -> None:
    a, fab = _incast(1)
    b, _ = _incast(1)
    assert a == b
    assert fab.dropped_bytes > 0
    assert fab.injected_bytes == fab.delivered_bytes + fab.dropped_bytes  # the heap ran dry: nothing in flight


@pytest.mark.parametrize("bound", [0.0, 0.05])
def test_an_incast_never_loses_more_than_the_bound(bound: float) -> None:
    config = PacketConfig(transport="dlcp", red=RedParams(min_bytes=60_000, max_bytes=60_000), buffer_bytes=200_000)
    fab = fabric(6, config)
    results = run_flows(fab, [Flow(s, 5, 800_000, cls=1, loss_bound=bound) for s in range(5)], config)
    assert sum(r.drops for r in results) > 0
    for r in results:
        for numel, lost, _, _ in r.receiver.records:
            assert lost <= int(bound * numel)
            if bound == 0.0:
                assert lost == 0


def test_an_incast_through_red_ends_within_a_tenth_of_dctcp() -> None:
    # 8 -> 1 at 10 Gbit/s, 2 MB each, K = 90 kB: the rate control neither collapses nor overflows the port
    red = RedParams(min_bytes=90_000, max_bytes=90_000)
    fcts = {}
    for name in ("dctcp", "dlcp"):
        config = PacketConfig(transport=name, red=red)
        results = run_flows(fabric(9, config), [Flow(s, 8, 2_000_000, cls=1) for s in range(8)], config)
        fcts[name] = max(r.fct_s for r in results)
    assert fcts["dlcp"] <= 1.1 * fcts["dctcp"], fcts


def test_reordering_across_bands_and_spines_is_not_counted_as_loss() -> None:
    # no drops (deep buffers, no RED), but datagrams sprayed over two spines and five strict-priority bands
    config = PacketConfig(
        transport="dlcp", priority_classes=5, topology="leaf_spine", hosts_per_leaf=3, spines=2, buffer_bytes=20_000_000
    )
    flows = [Flow(s, 5, 1_000_000, start_s=2e-4 * k, cls=k % 4) for s in range(3) for k in range(3)]
    results = run_flows(fabric(6, config), flows, config)
    assert sum(r.drops for r in results) == 0
    rates = [r.sender.rate for r in results]
    assert sum(rc.reordered for rc in rates) > 0  # datagrams counted lost for a while, then found overtaken
    assert all(rc.lost == 0 for rc in rates)  # no loss stayed
    assert all(rc.decreases == rc.timeouts + rc.undone for rc in rates)  # a cut for a loss, if any, undone


def test_a_message_that_may_lose_nothing_sends_every_packet_important() -> None:
    for bound, expect_unimportant in ((0.0, False), (0.1, True)):
        sender = DlcpSender(PacketConfig(transport="dlcp", dlcp=DlcpParams(quantile=0.5)), 0)
        out: list[Packet] = []
        sender.push(100 * STRIDE * 4, 0.0, out, MessageSpec(loss_bound=bound, priority=2))
        [transfer] = sender.transfers
        assert (not np.asarray(transfer.send._important).all()) is expect_unimportant
