"""Settings of the packet-level network: switch ports, topology, load balancing, transport.

Every number that changes a result is a field here, with its unit in its
name; nothing is hidden in the code. Defaults describe a small data-centre
fabric with jumbo frames and shallow switch buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from commsched.errors import ScheduleError

Topology = Literal["single_switch", "leaf_spine"]
LoadBalancing = Literal["ecmp", "spray"]


@dataclass(frozen=True)
class RedParams:
    """RED with ECN on one switch port, thresholds in bytes of the port's queue.

    Below ``min_bytes`` every packet is queued. Between ``min_bytes`` and
    ``max_bytes`` a packet is hit with probability
    ``max_p · (q - min) / (max - min)``; above ``max_bytes`` every packet is
    hit. A hit ECN-capable packet is marked (CE) and queued; a hit packet that
    is not ECN-capable is dropped. With ``hard_drop`` (classic RED) every
    packet above ``max_bytes`` is dropped, marked or not. ``weight``: the
    EWMA weight of the average queue (1 = the instantaneous queue, as DCTCP
    uses). ``min_bytes == max_bytes`` is DCTCP's single threshold K.
    """

    min_bytes: int = 90_000
    max_bytes: int = 90_000
    max_p: float = 1.0
    weight: float = 1.0
    hard_drop: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise ScheduleError(
                f"packet: RED needs 0 <= min_bytes <= max_bytes, got {self.min_bytes}, {self.max_bytes}"
            )
        if not 0 < self.max_p <= 1 or not 0 < self.weight <= 1:
            raise ScheduleError(f"packet: RED max_p and weight must be in (0, 1], got {self.max_p}, {self.weight}")


@dataclass(frozen=True)
class TcpParams:
    """TCP parameters, all explicit (the ns-3 comparison pins the same values there).

    ``segment_bytes``: payload per segment (MSS). ``header_bytes``: bytes a
    segment or an ACK adds on the wire (IP + TCP + options + link framing).
    ``initial_window_segments``: the first congestion window. RTO:
    ``max(min_rto_s, srtt + max(clock_granularity_s, 4·rttvar))``
    (RFC 6298 with a floor), ``initial_rto_s`` before the first sample,
    doubled on each expiry. ``dupack_threshold``: duplicate ACKs that
    trigger fast retransmit; ``limited_transmit`` (RFC 3042) sends a new
    segment on each duplicate ACK before that. ``delayed_ack_segments``: ACK every n-th
    in-order segment (1 = delayed ACK off), at the latest after
    ``delayed_ack_timeout_s``. ``handshake``: send a SYN and wait for the
    SYN-ACK before the first data (one RTT), as a fresh socket does.
    DCTCP: ``dctcp_g`` (EWMA gain of α) and ``dctcp_alpha_init``.
    pFabric: ``pfabric_window_segments`` (a fixed window, about one BDP) and
    ``pfabric_rto_s`` (a small fixed timeout).
    """

    segment_bytes: int = 8948
    header_bytes: int = 52
    initial_window_segments: int = 10
    min_rto_s: float = 1e-3
    initial_rto_s: float = 1e-3
    clock_granularity_s: float = 0.0
    max_rto_s: float = 60.0
    dupack_threshold: int = 3
    limited_transmit: bool = True
    delayed_ack_segments: int = 1
    delayed_ack_timeout_s: float = 200e-6
    handshake: bool = False
    dctcp_g: float = 1 / 16
    dctcp_alpha_init: float = 1.0
    pfabric_window_segments: int = 12
    pfabric_rto_s: float = 300e-6

    def __post_init__(self) -> None:
        if self.segment_bytes < 1 or self.header_bytes < 0 or self.initial_window_segments < 1:
            raise ScheduleError("packet: segment_bytes and initial_window_segments must be >= 1, header_bytes >= 0")
        if not (0 < self.min_rto_s <= self.max_rto_s and self.initial_rto_s > 0):
            raise ScheduleError(f"packet: need 0 < min_rto_s <= max_rto_s and initial_rto_s > 0, got {self}")
        if self.delayed_ack_segments < 1 or self.dupack_threshold < 1:
            raise ScheduleError("packet: delayed_ack_segments and dupack_threshold must be >= 1")


@dataclass(frozen=True)
class PacketConfig:
    """The packet-level network of one simulation.

    Topology (one host per worker, plus one per dedicated parameter server):
    ``single_switch`` connects every host to one switch; ``leaf_spine`` puts
    ``hosts_per_leaf`` hosts under each leaf and connects every leaf to each
    of ``spines`` spines at ``fabric_gbps`` (default: the fastest NIC) with
    ``fabric_latency_us`` per link. A host's link to its switch has the
    node's NIC rate and half its ``latency_us`` in each direction, so two
    hosts under one switch are ``latency_us`` apart, as in the α-β model; a
    node's ``per_message_overhead_us`` delays each message its host sends.

    Switch ports (every output port, switches and hosts): ``buffer_bytes``
    of shared buffer, drop-tail when full; ``priority_classes`` strict-priority
    bands (class 0 first; a task's priority is spread over the bands); ``red``
    adds RED/ECN to every band; ``pfabric`` makes each port a pFabric queue
    (dequeue the most urgent packet, drop the least urgent when full).
    Host NIC queues are unbounded (the sender's window bounds them).
    ``load_balancing``: ``ecmp`` hashes each connection onto one of the equal
    paths, ``spray`` picks a path per packet. ``transport``: a name in
    :data:`~commsched.sim.packet.transport.TRANSPORTS`. ``seed`` drives
    ECMP hashing, spraying and RED's coin, nothing else.
    ``record_queues``: keep per-port queue-depth samples (for the Chrome
    counter tracks; costs memory).
    """

    topology: Topology = "single_switch"
    hosts_per_leaf: int = 4
    spines: int = 2
    fabric_gbps: float = 0.0
    fabric_latency_us: float = 1.0
    buffer_bytes: int = 1_000_000
    priority_classes: int = 1
    red: RedParams | None = None
    pfabric: bool = False
    load_balancing: LoadBalancing = "ecmp"
    transport: str = "tcp"
    tcp: TcpParams = field(default_factory=TcpParams)
    seed: int = 0
    record_queues: bool = False

    def __post_init__(self) -> None:
        if self.topology not in ("single_switch", "leaf_spine"):
            raise ScheduleError(f"packet: topology must be single_switch or leaf_spine, got {self.topology!r}")
        if self.load_balancing not in ("ecmp", "spray"):
            raise ScheduleError(f"packet: load_balancing must be ecmp or spray, got {self.load_balancing!r}")
        if self.hosts_per_leaf < 1 or self.spines < 1 or self.priority_classes < 1 or self.buffer_bytes < 1:
            raise ScheduleError("packet: hosts_per_leaf, spines, priority_classes and buffer_bytes must be >= 1")
        if not (self.fabric_gbps >= 0 and math.isfinite(self.fabric_gbps)) or self.fabric_latency_us < 0:
            raise ScheduleError("packet: fabric_gbps and fabric_latency_us must be finite and >= 0")
