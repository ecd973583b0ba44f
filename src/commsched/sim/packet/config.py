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
Background = Literal["web_search", "data_mining"]


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
class DlcpParams:
    """DLCP's datagram transport in the packet network (:mod:`commsched.sim.packet.dlcp`).

    The state machines are the real link's (:mod:`commsched.transport.dlcp`);
    these are their knobs, set for a data-centre fabric where the real link's
    defaults suit a Python host that wakes every millisecond. Importance:
    a packet is important when its chunk norm is at least the ``quantile``
    of its transfer's chunk norms, or its layer class is below
    ``important_layer_classes`` (:func:`~commsched.transport.dlcp.protocol.classify`).
    PROBE ``probe_delay_s`` after the last packet, again every
    ``probe_timeout_s`` unanswered. The receiver ACKs every ``ack_every``
    datagrams (0: one per 48 KiB; the real link ACKs every 96 KiB), at the latest after
    ``ack_interval_s``. Rate control (:class:`~commsched.transport.dlcp.rate.RateParams`,
    whose docstring justifies each default): starts at ``initial_gbps`` and
    doubles per round trip until the first congestion signal, then DCTCP's
    cut with gain ``gain`` from ``alpha_init`` and one more datagram per
    round trip; a floor of ``min_gbps``; ``burst_bytes`` of pacing burst;
    gives up on what is in flight after ``max(feedback_timeout_s, srtt +
    4·rttvar)`` without feedback. ``spray``: datagrams go round-robin over the equal-cost
    paths by their sequence number, as the link round-robins over its path
    sockets (false: the fabric's ``load_balancing``). Completion: as the
    link's default, a bounded receive gives up holes within the bound only
    once the sender PROBEd (everything was sent once); ``stop_at_count``
    (``DlcpLink(stop_at_count=True)``, the rule DLCP and MLT describe) STOPs
    as soon as ``1 − loss_bound`` arrived.
    """

    # Why these defaults (none was chosen on a benchmark's outcome):
    # - quantile, important_layer_classes: classify()'s own defaults, as the link uses them.
    # - probe_delay_s: a floor only; the sender PROBEs max(probe_delay_s, 2·srtt) after its last datagram.
    # - probe_timeout_s: control packets travel in the top band, so a PROBE's answer waits behind no data
    #   queue; 500 µs is over 10 base round trips of the fabrics simulated here (µs links, 10-100 Gbit/s),
    #   so it fires only for a lost control packet.
    # - ack_every 0: one Ack per 48 KiB (sim.packet.dlcp.FABRIC_ACK_EVERY_BYTES: the link's 96 KiB answers a
    #   Python host's per-ACK cost); ack_interval_s: a few base round trips, so a
    #   sender too slow to trigger Acks still hears within its round trip's order of magnitude.
    # - initial_gbps: a fixed start, not the NIC's rate; slow start doubles it each round trip (at
    #   100 Gbit/s the line rate is reached in four round trips).
    # - min_gbps: the link's floor (RateParams.min_rate_bytes_per_s, 8 Mbit/s).
    # - gain, alpha_init: DCTCP's g and Linux DCTCP's initial α, as RateParams.
    # - burst_bytes: two jumbo datagrams, so a paced sender may follow one datagram by the next back to back.
    # - stop_at_count: the link's default (DlcpLink), so that a prediction is of what the runtime does.
    # - feedback_timeout_s: the TCP baselines' minimum RTO here (TcpParams.min_rto_s), so no transport
    #   gets a shorter timer than another; above it the timer is srtt + 4·rttvar.
    quantile: float = option(0.5, "a chunk norm at or above this quantile of its transfer's is important", ge=0, le=1)
    important_layer_classes: int = option(1, "layer classes below this are important whatever their norms", ge=0)
    probe_delay_s: float = option(20e-6, "PROBE this long after the last packet was sent", ge=0)
    probe_timeout_s: float = option(500e-6, "PROBE again after this long unanswered", gt=0)
    ack_every: int = option(0, "ACK every n datagrams (0: one per 48 KiB)", ge=0)
    ack_interval_s: float = option(50e-6, "longest a received datagram waits for its ACK", gt=0)
    initial_gbps: float = option(10.0, "rate a sender starts at (slow start doubles it per round trip)", gt=0)
    min_gbps: float = option(0.008, "lowest rate (a floor below any fair share; recovery does not depend on it)", gt=0)
    gain: float = option(1 / 16, "EWMA gain of the congestion estimate alpha (DCTCP's g)", gt=0, le=1)
    alpha_init: float = option(1.0, "alpha before any round trip (Linux DCTCP's)", ge=0, le=1)
    burst_bytes: int = option(18_000, "pacing burst (two jumbo datagrams)", ge=1)
    feedback_timeout_s: float = option(1e-3, "least time without feedback before giving up what is in flight", gt=0)
    spray: bool = option(True, "round-robin datagrams over the equal-cost paths (false: load_balancing)")
    stop_at_count: bool = option(False, "STOP once 1 - loss_bound arrived (MLT's rule; false: the link's default)")

    def __post_init__(self) -> None:
        _check_fields(self, "dlcp.")


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
    bands (class 0 first; a task's priority is spread over the bands, all but
    the last when there is background traffic, which has it); ``red``
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
    :data:`~commsched.sim.packet.registry.TRANSPORTS`, for lossless tasks
    (tasks the plan puts on DLCP run on ``dlcp``, with ``dlcp.*``). ``seed`` drives
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
    dlcp: DlcpParams = field(default_factory=DlcpParams, metadata={"doc": "DLCP's parameters (dlcp.*)"})
    acks_first: bool = option(True, "host-side ports send pure ACKs before queued data (false: one FIFO)")
    background_load: float = option(0.0, "offered load of background flows per host link (0: none)", ge=0, le=1)
    background: Background = option("web_search", "background flow sizes: web_search (DCTCP) or data_mining (VL2)")  # noqa: RUF009 (an immutable default)
    background_duration_s: float = option(1.0, "background flows arrive over [0, this)", ge=0)
    seed: int = option(0, "drives ECMP hashing, spraying, RED's coin, background flows, DLCP's magnitudes")
    record_queues: bool = option(False, "keep queue-depth samples for the Chrome counters")

    def __post_init__(self) -> None:
        _check_fields(self, "")
