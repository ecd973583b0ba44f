"""Settings of the packet-level network: switch ports, topology, load balancing, transport.

Every number that changes a result is a field here, with its unit in its
name and a one-line ``doc`` (and its range, ``gt``/``ge``/``le``) in the
field's metadata; nothing is hidden in the code. Defaults describe a small
data-centre fabric with jumbo frames and shallow switch buffers.
:mod:`commsched.sim.packet.options` reads ``KEY=VALUE`` text into these
classes (``--packet`` on the command line) and lists them.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from commsched.errors import ScheduleError

Topology = Literal["single_switch", "leaf_spine"]
LoadBalancing = Literal["ecmp", "spray"]


def option(
    default: Any,
    doc: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> Any:
    """A setting: its default, a one-line doc and, for numbers, its range (``> gt``, ``>= ge``, ``<= le``)."""
    return field(default=default, metadata={"doc": doc, "gt": gt, "ge": ge, "le": le})


def accepted(f: Any) -> str:
    """What a numeric field accepts, in words: ``> 0``, ``>= 1``, ``> 0 and <= 1`` ('' when unbounded)."""
    parts = [
        f"{op} {f.metadata[key]:g}"
        for key, op in (("gt", ">"), ("ge", ">="), ("le", "<="))
        if f.metadata.get(key) is not None
    ]
    return " and ".join(parts)


def problem(f: Any, kind: Any, value: Any) -> str | None:
    """None when ``value`` fits field ``f`` of type ``kind``, else what the field accepts, in words."""
    if kind is bool:
        ok = isinstance(value, bool)
        what = "true or false"
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        what = "a whole number"
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        what = "a finite number"
    elif typing.get_origin(kind) is Literal:
        ok = value in typing.get_args(kind)
        what = " or ".join(typing.get_args(kind))
    else:
        return None
    if kind in (int, float):
        what = f"{what} {accepted(f)}".rstrip()
        if ok:
            gt, ge, le = (f.metadata.get(k) for k in ("gt", "ge", "le"))
            ok = (gt is None or value > gt) and (ge is None or value >= ge) and (le is None or value <= le)
    return None if ok else what


def _check_fields(obj: Any, prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        what = problem(f, hints[f.name], value)
        if what is not None:
            raise ScheduleError(f"packet: {prefix}{f.name} must be {what}, got {value!r}")


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

    min_bytes: int = option(90_000, "queue below which nothing is marked or dropped", ge=0)
    max_bytes: int = option(90_000, "queue above which every packet is hit (= min_bytes: DCTCP's K)", ge=0)
    max_p: float = option(1.0, "hit probability reached at max_bytes", gt=0, le=1)
    weight: float = option(1.0, "EWMA weight of the average queue (1: the instantaneous queue)", gt=0, le=1)
    hard_drop: bool = option(False, "drop, not mark, every packet above max_bytes (classic RED)")

    def __post_init__(self) -> None:
        _check_fields(self, "red.")
        if self.min_bytes > self.max_bytes:
            raise ScheduleError(
                f"packet: RED needs red.min_bytes <= red.max_bytes, got {self.min_bytes}, {self.max_bytes}"
            )


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

    segment_bytes: int = option(8948, "payload per segment (MSS; 8948: jumbo frames)", ge=1)
    header_bytes: int = option(52, "bytes a segment or an ACK adds on the wire", ge=0)
    initial_window_segments: int = option(10, "first congestion window", ge=1)
    min_rto_s: float = option(1e-3, "floor of the retransmission timeout", gt=0)
    initial_rto_s: float = option(1e-3, "retransmission timeout before the first RTT sample", gt=0)
    clock_granularity_s: float = option(0.0, "G of RFC 6298: RTO >= srtt + G", ge=0)
    max_rto_s: float = option(60.0, "ceiling of the retransmission timeout", gt=0)
    dupack_threshold: int = option(3, "duplicate ACKs that trigger fast retransmit", ge=1)
    limited_transmit: bool = option(True, "a new segment per duplicate ACK below the threshold (RFC 3042)")
    delayed_ack_segments: int = option(1, "ACK every n-th in-order segment (1: delayed ACK off)", ge=1)
    delayed_ack_timeout_s: float = option(200e-6, "longest an ACK is delayed", ge=0)
    handshake: bool = option(False, "SYN and SYN-ACK before the first data")
    dctcp_g: float = option(1 / 16, "DCTCP: EWMA gain of alpha", gt=0, le=1)
    dctcp_alpha_init: float = option(1.0, "DCTCP: alpha before the first window", ge=0, le=1)
    pfabric_window_segments: int = option(12, "pFabric: fixed window (about one BDP)", ge=1)
    pfabric_rto_s: float = option(300e-6, "pFabric: fixed retransmission timeout", gt=0)

    def __post_init__(self) -> None:
        _check_fields(self, "tcp.")
        if self.min_rto_s > self.max_rto_s:
            raise ScheduleError(
                f"packet: need tcp.min_rto_s <= tcp.max_rto_s, got {self.min_rto_s:g}, {self.max_rto_s:g}"
            )


@dataclass(frozen=True)
class PacketConfig:
    """The packet-level network of one simulation.

    Topology (one host per worker, plus one per dedicated parameter server):
    ``single_switch`` connects every NIC to one switch; ``leaf_spine`` puts
    ``hosts_per_leaf`` NICs under each leaf and connects every leaf to each
    of ``spines`` spines at ``fabric_gbps`` (default: the fastest NIC) with
    ``fabric_latency_us`` per link. A NIC's link to its switch has the
    node's NIC rate and half its ``latency_us`` in each direction, so two
    single-device nodes under one switch are ``latency_us`` apart, as in the
    α-β model. The devices of a multi-device node share its NIC through a
    node switch on the node's ``intra`` link (:mod:`.topology`). A message
    waits its link's ``per_message_overhead_us`` before it is sent.

    Switch ports (every output port of a switch): ``buffer_bytes``
    of shared buffer, drop-tail when full; ``priority_classes`` strict-priority
    bands (class 0 first; a task's priority is spread over the bands); ``red``
    adds RED/ECN to every band; ``pfabric`` makes each port a pFabric queue
    (dequeue the most urgent packet, drop the least urgent when full).
    Host NIC queues, and the ports inside a node, are unbounded (the
    sender's window bounds them) and have the bands but no RED; with
    ``acks_first`` they send pure ACKs before any queued data, as a Linux
    host's ``fq``/``fq_codel`` serves a sparse ACK flow ahead of bulk flows
    (one FIFO instead, as ns-3's ``FifoQueueDisc``, lets a host's ACKs wait
    behind milliseconds of its own data and fire its peers' retransmission
    timers: docs/simulator.md).
    ``load_balancing``: ``ecmp`` hashes each connection onto one of the equal
    paths, ``spray`` picks a path per packet. ``transport``: a name in
    :data:`~commsched.sim.packet.transport.TRANSPORTS`. ``seed`` drives
    ECMP hashing, spraying and RED's coin, nothing else.
    ``record_queues``: keep per-port queue-depth samples (for the Chrome
    counter tracks; costs memory).
    """

    topology: Topology = option("single_switch", "single_switch or leaf_spine")  # noqa: RUF009 (an immutable default)
    hosts_per_leaf: int = option(4, "leaf_spine: NICs under each leaf", ge=1)
    spines: int = option(2, "leaf_spine: spine switches", ge=1)
    fabric_gbps: float = option(0.0, "leaf_spine: leaf-spine link rate (0: the fastest NIC)", ge=0)
    fabric_latency_us: float = option(1.0, "leaf_spine: one-way latency of a leaf-spine link", ge=0)
    buffer_bytes: int = option(1_000_000, "buffer of every switch output port (drop-tail)", ge=1)
    priority_classes: int = option(1, "strict-priority bands per port (task priorities spread over them)", ge=1)
    red: RedParams | None = option(None, "RED/ECN on switch ports (none: off; true: on with red.* defaults)")  # noqa: RUF009 (an immutable default)
    pfabric: bool = option(False, "pFabric switch queues (most urgent first, least urgent dropped)")
    load_balancing: LoadBalancing = option("ecmp", "ecmp (a path per connection) or spray (a path per packet)")  # noqa: RUF009 (an immutable default)
    transport: str = option("tcp", "tcp (NewReno), dctcp, pfabric, or a registered transport")
    tcp: TcpParams = field(default_factory=TcpParams, metadata={"doc": "transport parameters (tcp.*)"})
    acks_first: bool = option(True, "host-side ports send pure ACKs before queued data (false: one FIFO)")
    seed: int = option(0, "drives ECMP hashing, spraying and RED's coin")
    record_queues: bool = option(False, "keep queue-depth samples for the Chrome counters")

    def __post_init__(self) -> None:
        _check_fields(self, "")
