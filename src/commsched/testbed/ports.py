"""Switch ports for the emulated testbed, as pure builders: the port's shape, its tc commands, its nft rules.

DLCP/MLT rely on a commodity switch: DSCP selects a strict-priority queue,
and past a queue threshold ECN-capable (ECT) packets are marked CE while
not-ECT packets are dropped. :class:`SwitchShape` describes one such port;
:mod:`commsched.testbed.switch` applies it to the bridge ports of a
:class:`~commsched.testbed.netns.NetnsTestbed`. A bridge port is the veth
end inside the bridge namespace, so its egress is the switch's egress
toward one host; a drop there is a loss in the network, which the sender's
TCP stack learns about only from missing ACKs (a drop in the sender's own
egress qdisc is reported straight to the sending socket).

The tc hierarchy of one port (handles are hex)::

    [netem 1:]                       only with delay or jitter (see below)
      htb 2:, class 2:1              the port's line rate, burst max(2 frames, 1 ms at the rate)
        aqm="red":       prio 3:, bands 3:1..3:N, chosen by u32 filters on the DSCP field
                           band b: red <10+b>: ... ecn      (see red_args)
        aqm="virtual" and aqm="taildrop":
                         htb classes 2:<10+b>, class prio b, each guaranteed 1 % of the port,
                         the rest lent by class priority; u32 filters on the DSCP field
                           band b: pfifo <10+b>: limit buffer_pkts

``prio`` alone does not read the DSCP (its priomap maps skb->priority), so
u32 filters ``match ip dsfield <dscp << 2> 0xfc`` pick the band; IPv4
packets with another DSCP, and everything else (ARP), go to
``default_band``.

* ``aqm="red"``: tc's RED per band marks or drops on the real queue; it
  needs sch_prio and sch_red.
* ``aqm="virtual"`` (the default): the htb bands above, and before them an
  nftables rule per port and band (:func:`port_rules`,
  :mod:`commsched.testbed.nft`) that keeps a virtual queue of the port and
  marks ECT / drops not-ECT frames that arrive while it holds K frames or
  more; it needs htb, u32 and nftables' bridge family.
* ``aqm="taildrop"``: the htb bands alone; every packet is tail-dropped at
  ``buffer_pkts`` and nothing is marked.

Random loss (``loss_pct``) is an nftables rule at the port for every aqm:
it drops frames as they arrive at the port, like a lossy wire into the
switch, before any queue. Delay and jitter need netem, at the root above
the rate limit: it cannot sit below the queues, where its delay line would
count as backlog and make RED mark and drop for propagation delay, not
congestion. Its own queue holds 100000 packets, so it never drops. Jitter
reorders packets (DLCP does not care, TCP does).

Offloads are turned off on every veth first (``ethtool -K tso off gso off
gro off``; without ethtool, ``ip link`` caps ``gso_max_size`` and
``gso_max_segs``): with them on, a TCP sender hands 64 KiB super-packets
to the veth and the qdiscs see 44 frames as one packet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commsched.errors import SpecError
from commsched.testbed.commands import Layout, LinkShape, format_rate, netem_args
from commsched.testbed.counters import band_handle
from commsched.testbed.nft import PortRules

Aqm = Literal["red", "virtual", "taildrop"]
AQMS: tuple[Aqm, ...] = ("red", "virtual", "taildrop")
OffloadTool = Literal["ethtool", "ip"]

# The two halves of the IPv4 TOS byte: DSCP (upper 6 bits) and ECN (lower 2, RFC 3168).
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3
DSCP_IMPORTANT = 46  # EF: DLCP's important (ECN-capable) gradient packets, top band
DSCP_UNIMPORTANT = 8  # CS1: the unimportant (not-ECT) ones, bottom band
ETHERNET_HEADER_BYTES = 14
DEFAULT_QUEUE_PKTS = 20
PORT_BURST_S = 0.001
BAND_FLOOR_FRACTION = 0.01  # taildrop: each band's guaranteed share of the port


def tos_byte(dscp: int, ecn: int) -> int:
    """The IPv4 TOS byte (``IP_TOS``) carrying ``dscp`` and the ECN codepoint ``ecn``."""
    return (dscp << 2) | ecn


@dataclass(frozen=True)
class SwitchShape:
    """One egress port of the emulated switch.

    ``rate_bps`` is the port's line rate. ``queue_pkts`` (or ``queue_ms`` at
    the port rate; the default is 20 packets) is the marking/dropping
    threshold K of every band; ``buffer_pkts`` (default 4·K) its hard limit.
    ``dscp_bands`` maps DSCP values to bands, 0 served first; other traffic
    goes to ``default_band``. ``aqm``: how the threshold acts (module
    docstring; default ``"virtual"``). ``loss_pct`` drops that fraction of the
    frames arriving at the port (nftables); ``delay_ms`` and ``jitter_ms`` add
    a netem stage. Invalid values raise :class:`SpecError` naming the field
    and the value.
    """

    rate_bps: int
    queue_pkts: int | None = None
    queue_ms: float | None = None
    buffer_pkts: int | None = None
    bands: int = 3
    dscp_bands: tuple[tuple[int, int], ...] = ((DSCP_IMPORTANT, 0), (DSCP_UNIMPORTANT, 2))
    default_band: int = 1
    aqm: Aqm = "virtual"
    loss_pct: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    mtu_bytes: int = 1500

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.rate_bps, int) or self.rate_bps < 8_000:
            problems.append(f"rate_bps: must be an integer >= 8000 (bit/s), got {self.rate_bps!r}")
        if self.queue_pkts is not None and self.queue_ms is not None:
            problems.append(f"queue_ms: give queue_pkts or queue_ms, not both, got {self.queue_ms!r}")
        if self.queue_pkts is not None and not 1 <= self.queue_pkts <= 100_000:
            problems.append(f"queue_pkts: must be between 1 and 100000, got {self.queue_pkts!r}")
        if self.queue_ms is not None and not 0 < self.queue_ms <= 10_000:
            problems.append(f"queue_ms: must be in (0, 10000], got {self.queue_ms!r}")
        if not 2 <= self.bands <= 8:
            problems.append(f"bands: must be between 2 and 8 (a switch port has 8 queues), got {self.bands!r}")
        if not 0 <= self.default_band < self.bands:
            problems.append(f"default_band: must be in [0, {self.bands}), got {self.default_band!r}")
        seen: set[int] = set()
        for i, (dscp, band) in enumerate(self.dscp_bands):
            if not 0 <= dscp <= 63:
                problems.append(f"dscp_bands[{i}]: DSCP must be in [0, 63], got {dscp!r}")
            if dscp in seen:
                problems.append(f"dscp_bands[{i}]: DSCP {dscp} is mapped twice")
            if not 0 <= band < self.bands:
                problems.append(f"dscp_bands[{i}]: band must be in [0, {self.bands}), got {band!r}")
            seen.add(dscp)
        if self.aqm not in AQMS:
            problems.append(f"aqm: must be one of {', '.join(map(repr, AQMS))}, got {self.aqm!r}")
        if not 0.0 <= self.loss_pct < 100.0:
            problems.append(f"loss_pct: must be in [0, 100), got {self.loss_pct!r}")
        if not 0.0 <= self.delay_ms <= 10_000:
            problems.append(f"delay_ms: must be between 0 and 10000, got {self.delay_ms!r}")
        if not 0.0 <= self.jitter_ms <= self.delay_ms:
            problems.append(f"jitter_ms: must be between 0 and delay_ms ({self.delay_ms}), got {self.jitter_ms!r}")
        if not 68 <= self.mtu_bytes <= 65_535:
            problems.append(f"mtu_bytes: must be between 68 and 65535, got {self.mtu_bytes!r}")
        if not problems and self.buffer_pkts is not None and self.buffer_pkts <= self.threshold_pkts:
            problems.append(f"buffer_pkts: must exceed the threshold ({self.threshold_pkts}), got {self.buffer_pkts!r}")
        if problems:
            raise SpecError("switch shape", problems)

    @property
    def frame_bytes(self) -> int:
        """A full frame as qdiscs count it (IP packet plus Ethernet header)."""
        return self.mtu_bytes + ETHERNET_HEADER_BYTES

    @property
    def threshold_pkts(self) -> int:
        """K: ``queue_pkts``, or ``round(queue_ms / 1000 · rate_bps / 8 / frame_bytes)``, at least 1."""
        if self.queue_pkts is not None:
            return self.queue_pkts
        if self.queue_ms is not None:
            return max(1, round(self.queue_ms / 1000 * self.rate_bps / 8 / self.frame_bytes))
        return DEFAULT_QUEUE_PKTS

    @property
    def limit_pkts(self) -> int:
        return self.buffer_pkts if self.buffer_pkts is not None else 4 * self.threshold_pkts

    @property
    def needs_netem(self) -> bool:
        """Delay (and jitter, which needs a delay) takes netem; loss does not (an nftables rule)."""
        return self.delay_ms > 0

    @property
    def needs_nft(self) -> bool:
        """The virtual queue and random loss are nftables rules in the bridge namespace."""
        return self.aqm == "virtual" or self.loss_pct > 0

    @property
    def label(self) -> str:
        """Short: ``20mbit/K10/red``, ``300mbit/K20/virtual+1%loss``."""
        parts = [f"{format_rate(self.rate_bps)}/K{self.threshold_pkts}/{self.aqm}"]
        if self.delay_ms:
            parts.append(f"{self.delay_ms:g}ms" + (f"±{self.jitter_ms:g}ms" if self.jitter_ms else ""))
        if self.loss_pct:
            parts.append(f"{self.loss_pct:g}%loss")
        return "+".join(parts)

    def band_of(self, dscp: int) -> int:
        return dict(self.dscp_bands).get(dscp, self.default_band)


# ------------------------------------------------------------------ command builders (pure)


def red_args(shape: SwitchShape) -> list[str]:
    """RED for one band: a step at K frames, marking ECT packets and dropping the others.

    With A = ``frame_bytes``, K = ``threshold_pkts`` and B = ``limit_pkts``:
    ``min`` = K·A and ``max`` = (K+1)·A with ``probability`` 1, so the mark/drop
    probability rises from 0 to 1 within one frame past K (a switch's ECN
    threshold); ``burst`` = K, the smallest tc accepts for this ``min``, gives
    the EWMA weight 1/2, so the average follows the instantaneous queue
    within a few packets; ``limit`` = B·A is the band's buffer, past which ECT
    packets too are dropped (RED's ``pdrop``); ``bandwidth`` = the port rate.
    """
    a, k = shape.frame_bytes, shape.threshold_pkts
    return [
        "red", "limit", str(shape.limit_pkts * a), "min", str(k * a), "max", str((k + 1) * a),
        "avpkt", str(a), "burst", str(k), "probability", "1.0", "bandwidth", f"{shape.rate_bps}bit", "ecn",
    ]  # fmt: skip


def _htb_class(rate_bps: int, ceil_bps: int, burst_bytes: int, frame_bytes: int) -> list[str]:
    burst = str(burst_bytes)
    return [
        "htb", "rate", f"{rate_bps}bit", "ceil", f"{ceil_bps}bit", "burst", burst, "cburst", burst,
        "quantum", str(frame_bytes),
    ]  # fmt: skip


def port_commands(ns: str, dev: str, shape: SwitchShape) -> list[list[str]]:
    """The ``tc`` commands making ``dev`` (in namespace ``ns``) a switch port; run on a port without a root qdisc."""
    tc = ["tc", "-n", ns]
    qdisc, klass, filt = [*tc, "qdisc", "add", "dev", dev], [*tc, "class", "add", "dev", dev], [*tc, "filter"]
    a = shape.frame_bytes
    burst = max(2 * a, round(shape.rate_bps / 8 * PORT_BURST_S))
    cmds: list[list[str]] = []
    if shape.needs_netem:
        netem = LinkShape(delay_ms=shape.delay_ms, jitter_ms=shape.jitter_ms)
        cmds.append([*qdisc, "root", "handle", "1:", *netem_args(netem)])
        top = ["parent", "1:1"]
    else:
        top = ["root"]
    leaves = [f"2:{0x10 + b:x}" for b in range(shape.bands)]  # virtual, taildrop: the htb bands
    default = "1" if shape.aqm == "red" else leaves[shape.default_band].split(":")[1]
    cmds += [
        [*qdisc, *top, "handle", "2:", "htb", "default", default],
        [*klass, "parent", "2:", "classid", "2:1", *_htb_class(shape.rate_bps, shape.rate_bps, burst, a)],
    ]
    if shape.aqm == "red":
        priomap = [str(shape.default_band)] * 16
        cmds.append([*qdisc, "parent", "2:1", "handle", "3:", "prio", "bands", str(shape.bands), "priomap", *priomap])
        cmds += [
            [*qdisc, "parent", f"3:{b + 1}", "handle", band_handle(b), *red_args(shape)] for b in range(shape.bands)
        ]
        classify, flows = "3:", [f"3:{b + 1}" for b in range(shape.bands)]
    else:
        floor = max(8_000, round(shape.rate_bps * BAND_FLOOR_FRACTION))
        for b, leaf in enumerate(leaves):  # a floor guaranteed, up to the port rate lent by class priority
            htb = _htb_class(floor, shape.rate_bps, burst, a)
            cmds.append([*klass, "parent", "2:1", "classid", leaf, *htb, "prio", str(b)])
            cmds.append([*qdisc, "parent", leaf, "handle", band_handle(b), "pfifo", "limit", str(shape.limit_pkts)])
        classify, flows = "2:", leaves
    for dscp, band in shape.dscp_bands:
        match = ["u32", "match", "ip", "dsfield", f"0x{tos_byte(dscp, 0):02x}", "0xfc", "flowid", flows[band]]
        cmds.append([*filt, "add", "dev", dev, "parent", classify, "protocol", "ip", "prio", "1", *match])
    return cmds


def offload_commands(layout: Layout, tool: OffloadTool, mtu_bytes: int = 1500) -> list[list[str]]:
    """Turn segmentation and receive offloads off on both ends of every veth.

    ``ethtool``: ``-K <dev> tso off gso off gro off``. ``ip``: no switch for
    that, but ``gso_max_segs 1`` and ``gso_max_size``/``gro_max_size`` of one
    frame make the stack hand the veth one MTU-sized packet at a time (veth
    does no GRO unless turned on).
    """
    frame = str(mtu_bytes + ETHERNET_HEADER_BYTES)
    ends = [(layout.worker_ns(r), layout.worker_dev(r, p)) for r, p in layout.links()]
    ends += [(layout.bridge_ns, layout.bridge_port(r, p)) for r, p in layout.links()]
    if tool == "ethtool":
        return [
            ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off"]
            for ns, dev in ends
        ]
    limits = ["gso_max_size", frame, "gso_max_segs", "1", "gro_max_size", frame]
    return [["ip", "-n", ns, "link", "set", "dev", dev, *limits] for ns, dev in ends]


def port_rules(shape: SwitchShape, port: str) -> PortRules | None:
    """The nftables part of port ``port``: random loss and (``aqm="virtual"``) the virtual queue; None if neither.

    The virtual queue drains at the port rate counted in full frames,
    ``round(rate_bps / 8 / frame_bytes)`` per second (at least 1), and holds K.
    """
    if not shape.needs_nft:
        return None
    return PortRules(
        port=port,
        bands=shape.bands,
        dscp_bands=shape.dscp_bands,
        default_band=shape.default_band,
        loss_pct=shape.loss_pct,
        virtual=shape.aqm == "virtual",
        rate_pps=max(1, round(shape.rate_bps / 8 / shape.frame_bytes)),
        threshold_pkts=shape.threshold_pkts,
    )
