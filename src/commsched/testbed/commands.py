"""Pure builders of the ``ip`` / ``tc`` command lines of the testbed, and leftover detection rules.

Nothing here runs a command, so every rule can be tested without root.

Topology of one testbed with prefix ``P`` (e.g. ``csb-4242-0-``) and ``n`` workers::

    namespace P+"br":  bridge "br0", ports b0 .. b(n-1)         (no address, no route anywhere else)
    namespace P+"w<r>": veth "w<r>" (10.77.0.<r+1>/24) <-> "b<r>" in P+"br", plus "lo"

With ``paths=2`` (two disjoint paths between every pair of workers, for
per-packet spraying) the bridge namespace also holds bridge "br1", and
every worker a second veth "w<r>p1" (10.77.1.<r+1>/24) <-> "b<r>p1" on it:
a packet sent to a peer's 10.77.1.x address crosses br1, one sent to its
10.77.0.x address crosses br0. Path ``p`` uses subnet 10.77.<p>.0/24.

Every link is created inside the run's own namespaces (never in the root
namespace), so two runs cannot collide even though they use the same
addresses, and deleting the namespaces removes every link and the bridge.

Shaping (:class:`LinkShape`) is per worker link (on every path) and direction:

* rate: a ``tbf`` on ``w<r>`` (what worker r sends) and on ``b<r>`` (what
  worker r receives), so each worker has a full-duplex link of that rate
  to the bridge, like a host NIC on a non-blocking switch;
* delay, jitter: ``netem`` on ``w<r>`` only (under an ``htb`` class of
  the rate when there is one), so a packet between two workers is delayed
  once: ``delay`` is the one-way latency between any two workers (RTT =
  2 × delay);
* loss: an nftables rule in the bridge namespace drops that fraction of
  the frames worker r sends as they enter the bridge
  (:func:`~commsched.testbed.nft.link_loss_ruleset`): once per packet
  between two workers, and in the network, so a TCP sender learns of it
  only from missing ACKs (netem's loss on ``w<r>`` would be a drop in the
  sender's own qdisc, which TCP hears of at once and resends).

Switch ports (priority by DSCP, ECN/RED) replace the qdisc on ``b<r>``:
see :mod:`commsched.testbed.switch`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "csb-"
# path p's subnet is 10.77.<p>.0/24: private (RFC 1918), only ever configured inside a run's own namespaces
SUBNET_PREFIX = "10.77"
MAX_WORKERS = 250
MAX_PATHS = 4

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*$", re.IGNORECASE)
_OWNER_RE = re.compile(r"^" + re.escape(PREFIX) + r"(\d+)-")

# tbf: the bucket holds 2 ms at the rate, at least 64 KiB (one GSO segment) plus a frame;
# the queue holds 50 ms of traffic before tail drop.
TBF_BURST_S = 0.002
TBF_MIN_BURST_BYTES = 64 * 1024 + 1514
TBF_LATENCY_MS = 50
NETEM_LIMIT_PACKETS = 100_000


def parse_rate(text: str) -> int | None:
    """``"1gbit"`` -> 1_000_000_000 bit/s; ``"none"`` (or empty) -> None (unshaped).

    Units are tc's bit units with decimal prefixes: ``bit``, ``kbit``, ``mbit``,
    ``gbit``, ``tbit``. Byte units (tc's ``mbps`` means megabytes/s) are refused
    because they are too easy to misread.
    """
    if text.strip().lower() in ("", "none", "unshaped", "0"):
        return None
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"bandwidth: expected a rate like 1gbit, 300mbit, 50mbit or none, got {text!r}")
    rate = round(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if rate < 8_000:
        raise ValueError(f"bandwidth: must be at least 8kbit, got {text!r}")
    return rate


def format_rate(rate_bps: int | None) -> str:
    """The shortest exact tc spelling: 1_000_000_000 -> ``1gbit``; None -> ``none``."""
    if rate_bps is None:
        return "none"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        scale = _RATE_UNITS[unit]
        if rate_bps % scale == 0:
            return f"{rate_bps // scale}{unit}"
    return f"{rate_bps}bit"


@dataclass(frozen=True)
class LinkShape:
    """What every worker link looks like: rate (bit/s, None = unlimited), one-way delay, jitter, loss."""

    rate_bps: int | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_bps is not None and self.rate_bps < 8_000:
            raise ValueError(f"rate_bps: must be >= 8000 or None, got {self.rate_bps!r}")
        if not 0.0 <= self.delay_ms <= 10_000:
            raise ValueError(f"delay_ms: must be between 0 and 10000, got {self.delay_ms!r}")
        if not 0.0 <= self.jitter_ms <= self.delay_ms:
            raise ValueError(f"jitter_ms: must be between 0 and delay_ms ({self.delay_ms}), got {self.jitter_ms!r}")
        if not 0.0 <= self.loss_pct < 100.0:
            raise ValueError(f"loss_pct: must be in [0, 100), got {self.loss_pct!r}")

    @property
    def shaped(self) -> bool:
        return self.rate_bps is not None or self.needs_netem or self.needs_nft

    @property
    def needs_netem(self) -> bool:
        """Delay (jitter needs one) takes netem; loss is an nftables rule at the bridge."""
        return self.delay_ms > 0

    @property
    def needs_nft(self) -> bool:
        return self.loss_pct > 0

    @property
    def label(self) -> str:
        """Short and unique: ``none``, ``1gbit``, ``300mbit+2ms±0.5ms+0.1%loss``."""
        parts = [format_rate(self.rate_bps)] if self.rate_bps is not None else []
        if self.delay_ms:
            parts.append(f"{self.delay_ms:g}ms" + (f"±{self.jitter_ms:g}ms" if self.jitter_ms else ""))
        if self.loss_pct:
            parts.append(f"{self.loss_pct:g}%loss")
        return "+".join(parts) or "none"

    @property
    def description(self) -> str:
        """For people: ``unshaped``, else the label (``none`` is what ``--bandwidth`` takes, not what one reads)."""
        return self.label if self.shaped else "unshaped"


@dataclass(frozen=True)
class Layout:
    """Names and addresses of one testbed; ``paths`` bridges, each reaching every worker over a veth of its own."""

    prefix: str
    workers: int
    paths: int = 1
    mtu_bytes: int = 1500

    def __post_init__(self) -> None:
        if not 68 <= self.mtu_bytes <= 65_535:
            raise ValueError(f"mtu_bytes: must be between 68 and 65535, got {self.mtu_bytes!r}")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers: must be between 1 and {MAX_WORKERS}, got {self.workers!r}")
        if not 1 <= self.paths <= MAX_PATHS:
            raise ValueError(f"paths: must be between 1 and {MAX_PATHS}, got {self.paths!r}")
        if not self.prefix.startswith(PREFIX) or owner_pid(self.prefix) is None:
            raise ValueError(f"prefix: must look like {PREFIX}<pid>-<n>-, got {self.prefix!r}")

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}br"

    def worker_ns(self, rank: int) -> str:
        return f"{self.prefix}w{rank}"

    @staticmethod
    def worker_dev(rank: int, path: int = 0) -> str:
        return f"w{rank}" if path == 0 else f"w{rank}p{path}"

    @staticmethod
    def bridge_port(rank: int, path: int = 0) -> str:
        return f"b{rank}" if path == 0 else f"b{rank}p{path}"

    @staticmethod
    def bridge_dev(path: int = 0) -> str:
        return f"br{path}"

    @staticmethod
    def address(rank: int, path: int = 0) -> str:
        return f"{SUBNET_PREFIX}.{path}.{rank + 1}"

    def links(self) -> list[tuple[int, int]]:
        """Every (rank, path) veth pair, rank by rank."""
        return [(r, p) for r in range(self.workers) for p in range(self.paths)]

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the testbed, bridge last (deleting workers first frees their veths)."""
        return [self.worker_ns(r) for r in range(self.workers)] + [self.bridge_ns]


def veth_peer(dev: str, mtu: str, ns: str) -> list[str]:
    """The rest of ``ip link add <port> mtu <mtu> ...``: a veth whose other end is ``dev`` in ``ns``."""
    return ["type", "veth", "peer", "name", dev, "mtu", mtu, "netns", ns]


def create_commands(layout: Layout) -> list[list[str]]:
    """Namespaces, bridge, one veth pair per worker (both ends at ``mtu_bytes``), addresses; all links up."""
    br, mtu = layout.bridge_ns, str(layout.mtu_bytes)
    cmds = [["ip", "netns", "add", br]]
    for p in range(layout.paths):
        cmds += [
            ["ip", "-n", br, "link", "add", layout.bridge_dev(p), "type", "bridge"],
            ["ip", "-n", br, "link", "set", layout.bridge_dev(p), "up"],
        ]
    for r in range(layout.workers):
        ns = layout.worker_ns(r)
        cmds += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"]]
        for p in range(layout.paths):
            dev, port = layout.worker_dev(r, p), layout.bridge_port(r, p)
            cmds += [
                ["ip", "-n", br, "link", "add", port, "mtu", mtu, *veth_peer(dev, mtu, ns)],
                ["ip", "-n", br, "link", "set", port, "master", layout.bridge_dev(p)],
                ["ip", "-n", br, "link", "set", port, "up"],
                ["ip", "-n", ns, "addr", "add", f"{layout.address(r, p)}/24", "dev", dev],
                ["ip", "-n", ns, "link", "set", dev, "up"],
            ]
    return cmds


def shaper_burst_bytes(rate_bps: int) -> int:
    """The bytes a link's shaper (tbf, htb) lets through at once after an idle spell: its bucket."""
    return max(TBF_MIN_BURST_BYTES, round(rate_bps / 8 * TBF_BURST_S))


def tbf_args(rate_bps: int) -> list[str]:
    burst = shaper_burst_bytes(rate_bps)
    return ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"]


def netem_args(shape: LinkShape) -> list[str]:
    """netem's delay and jitter (loss is not netem's here: see the module docstring)."""
    args = ["netem", "limit", str(NETEM_LIMIT_PACKETS), "delay", f"{shape.delay_ms:g}ms"]
    return args + ([f"{shape.jitter_ms:g}ms"] if shape.jitter_ms else [])


def shaping_commands(layout: Layout, shape: LinkShape) -> list[list[str]]:
    """Root qdiscs for every link (run after :func:`clear_shaping_commands`); nothing when unshaped."""
    return [argv for r in range(layout.workers) for argv in worker_shaping_commands(layout, r, shape)]


def worker_shaping_commands(layout: Layout, rank: int, shape: LinkShape) -> list[list[str]]:
    """Root qdiscs for worker ``rank``'s links (every path), both directions (nothing when unshaped)."""
    cmds: list[list[str]] = []
    r = rank
    for p in range(layout.paths):
        ns, dev = layout.worker_ns(r), layout.worker_dev(r, p)
        up = ["tc", "-n", ns, "qdisc", "add", "dev", dev]
        if shape.needs_netem and shape.rate_bps is not None:
            burst = str(shaper_burst_bytes(shape.rate_bps))
            rate = f"{shape.rate_bps}bit"
            htb = ["rate", rate, "ceil", rate, "burst", burst, "cburst", burst]
            cmds += [
                [*up, "root", "handle", "1:", "htb", "default", "1"],
                ["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", *htb],
                [*up, "parent", "1:1", "handle", "10:", *netem_args(shape)],
            ]
        elif shape.needs_netem:
            cmds.append([*up, "root", *netem_args(shape)])
        elif shape.rate_bps is not None:
            cmds.append([*up, "root", *tbf_args(shape.rate_bps)])
        if shape.rate_bps is not None:
            port = layout.bridge_port(r, p)
            cmds.append(["tc", "-n", layout.bridge_ns, "qdisc", "add", "dev", port, "root", *tbf_args(shape.rate_bps)])
    return cmds


def link_loss_by_port(layout: Layout, loss_pct_by_rank: dict[int, float]) -> dict[str, float]:
    """Bridge port -> loss % of the frames entering the bridge there: every path of worker r at its loss."""
    return {layout.bridge_port(r, p): pct for r, pct in loss_pct_by_rank.items() for p in range(layout.paths)}


def clear_shaping_commands(layout: Layout) -> list[list[str]]:
    """Remove the root qdisc of every link (each fails harmlessly when there is none)."""
    cmds = []
    for r, p in layout.links():
        cmds.append(["tc", "-n", layout.worker_ns(r), "qdisc", "del", "dev", layout.worker_dev(r, p), "root"])
        cmds.append(["tc", "-n", layout.bridge_ns, "qdisc", "del", "dev", layout.bridge_port(r, p), "root"])
    return cmds


def delete_commands(layout: Layout) -> list[list[str]]:
    """Deleting a namespace deletes its links; a veth pair dies with either end."""
    return [["ip", "netns", "del", ns] for ns in layout.namespaces]


def worker_command(layout: Layout, rank: int, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", layout.worker_ns(rank), *argv]


# ---------------------------------------------------------------- leftovers


def owner_pid(name: str) -> int | None:
    """The pid that created a project namespace or link (``csb-<pid>-...``), else None."""
    m = _OWNER_RE.match(name)
    return int(m.group(1)) if m else None


def parse_netns_list(text: str) -> list[str]:
    """Names from ``ip netns list`` (lines like ``name (id: 3)`` or ``name``)."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def parse_link_names(text: str) -> list[str]:
    """Interface names from ``ip -o link show`` (``3: name@peer: <...>``)."""
    names = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2 and parts[1].strip():
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def is_stale(created_s: float | None, owner_started_s: float | None, slack_s: float = 2.0) -> bool:
    """A project object is stale when its owner is gone or its pid now belongs to a younger process.

    ``owner_started_s`` is None when the pid is dead; ``created_s`` (when the
    object was made) is None when unknown, and then a live pid counts as the owner.
    """
    if owner_started_s is None:
        return True
    if created_s is None:
        return False
    return owner_started_s > created_s + slack_s
