"""nftables rules of the testbed's bridge: random loss and the switch ports' ECN/drop threshold.

The kernels this testbed meets do not all have ``sch_netem`` (loss) or
``sch_red`` (ECN marking), but nftables' bridge family is common. Its
``forward`` hook sees every frame the bridge forwards, with the port it
came in on (``iifname``) and the port it leaves by (``oifname``), before
the frame is queued at that port's egress qdisc, so a rule there acts
*inside the network*: a drop is a loss on the wire, which a TCP sender
learns of only from missing ACKs (unlike a drop in its own qdisc).

Two tables live in the bridge namespace, each loaded whole with
``nft -f`` and deleted with its namespace:

* ``csb_links`` (:func:`link_loss_ruleset`): ``LinkShape.loss_pct`` of
  worker r drops that fraction of the IPv4 frames r sends, as they enter
  the bridge (``iifname "b<r>"``, ``numgen random``). ARP is never lost: a
  lost ARP request stalls its sender for a second, which no network
  between hosts that have talked before would show.
* ``csb_switch`` (:func:`switch_ruleset`): per switch port (``oifname``)
  and band (by DSCP, as the port's tc filters): random loss, then a
  *virtual queue* that stands in for RED's threshold.

The virtual queue
    A token bucket drains at the port rate and holds K frames (nft
    ``limit rate N/second burst K packets``, N = the port rate in
    full frames per second): a frame that finds a token joins the virtual
    queue; one that finds none arrives while K or more frames are queued,
    and is marked CE when it is ECN-capable (``ip ecn set ce``, the IPv4
    checksum fixed by nft) or dropped when it is not. This is a phantom
    queue (HULL, Alizadeh et al., NSDI'12) at γ = 1, and equal to the
    fluid backlog of the port while the real queue drains at the port
    rate. Strict priority is kept: band b's virtual queue counts the
    frames of bands 0..b (the work served before a band-b frame), so a
    frame that joins band j also takes a token, when there is one, from
    every band below j.

    What it is not (see docs/testbed.md): nft's byte-mode limit holds one
    second of traffic plus the burst, far too deep for a threshold, so the
    queue counts frames, each as a full frame; frames shorter than
    :data:`VQ_MIN_PACKET_BYTES` (ACKs, control, ARP) pass it uncounted and
    unmarked; a marked frame takes no token (nft's limit never goes below
    zero), so while marking, the real queue grows past K and the marks stop
    K frame times after the excess stops, where RED would go on marking
    until the real queue drained below K.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LINKS_TABLE = "csb_links"
SWITCH_TABLE = "csb_switch"
#: Frames (IP packet lengths) below this pass the virtual queue uncounted: pure ACKs, control messages, ARP.
VQ_MIN_PACKET_BYTES = 200
#: ``numgen random mod LOSS_SCALE < n`` drops with probability n / LOSS_SCALE (resolution 0.0001 %).
LOSS_SCALE = 1_000_000


def loss_threshold(loss_pct: float) -> int:
    """``n`` in ``numgen random mod 1000000 < n``: ``loss_pct`` % rounded to 0.0001 %."""
    return round(loss_pct / 100 * LOSS_SCALE)


def _loss_rule(loss_pct: float, counter: str) -> str:
    """IPv4 frames only: a lost ARP request would stall its sender for a second (the neighbour timer)."""
    n = loss_threshold(loss_pct)
    return f'ether type ip numgen random mod {LOSS_SCALE} < {n} counter name "{counter}" drop'


def link_loss_ruleset(loss_pct_by_port: Mapping[str, float]) -> str:
    """``csb_links``: drop ``loss_pct`` % of the IPv4 frames entering the bridge at each port (counter ``<port>_lost``).

    ``loss_pct_by_port``: bridge port name -> loss %; ports at 0 get no rule.
    """
    ports = {p: pct for p, pct in loss_pct_by_port.items() if loss_threshold(pct) > 0}
    lines = [f"table bridge {LINKS_TABLE} {{"]
    lines += [f"    counter {port}_lost {{ }}" for port in ports]
    lines += ["    chain forward {", "        type filter hook forward priority -10; policy accept;"]
    lines += [f'        iifname "{port}" {_loss_rule(pct, f"{port}_lost")}' for port, pct in ports.items()]
    return "\n".join([*lines, "    }", "}", ""])


@dataclass(frozen=True)
class PortRules:
    """What ``csb_switch`` does at one port: classification, loss, and (``virtual``) the virtual queue.

    ``rate_pps``: the port rate in full frames per second; ``threshold_pkts``:
    K; ``dscp_bands``: DSCP -> band, others to ``default_band``.
    """

    port: str
    bands: int
    dscp_bands: tuple[tuple[int, int], ...]
    default_band: int
    loss_pct: float
    virtual: bool
    rate_pps: int
    threshold_pkts: int

    def counter(self, what: str, band: int) -> str:
        """The name of a counter object: ``b2_lost0``, ``b2_marked1``, ``b2_early2``."""
        return f"{self.port}_{what}{band}"

    def counters(self) -> list[str]:
        kinds = (["lost"] if loss_threshold(self.loss_pct) else []) + (["marked", "early"] if self.virtual else [])
        return [self.counter(k, b) for b in range(self.bands) for k in kinds]

    def limits(self) -> list[str]:
        if not self.virtual:
            return []
        # not "rate over": `limit name` then matches, and takes a token, while the bucket has one
        rate = f"rate {self.rate_pps}/second burst {self.threshold_pkts} packets"
        return [f"{self._queue(b)} {{ {rate} }}" for b in range(self.bands)]

    def _queue(self, band: int) -> str:
        return f"{self.port}_q{band}"

    def chains(self) -> list[tuple[str, list[str]]]:
        """``(name, rules)`` of the port's chains: classification, one per band, and the joins below each band."""
        out = [(self.port, [f"ip dscp {d} goto {self.port}_band{b}" for d, b in self.dscp_bands])]
        out[0][1].append(f"goto {self.port}_band{self.default_band}")
        for b in range(self.bands):
            rules = [_loss_rule(self.loss_pct, self.counter("lost", b))] if loss_threshold(self.loss_pct) else []
            if self.virtual:
                last = b == self.bands - 1
                joined = "accept" if last else f"goto {self.port}_below{b}"
                rules += [
                    f"meta length < {VQ_MIN_PACKET_BYTES} accept",
                    f'limit name "{self._queue(b)}" {joined}',
                    f'ip ecn != not-ect ip ecn set ce counter name "{self.counter("marked", b)}" {joined}',
                    f'counter name "{self.counter("early", b)}" drop',
                ]
                if not last:  # a token from each band below, where there is one (no verdict: on either way)
                    out.append(
                        (f"{self.port}_below{b}", [f'limit name "{self._queue(q)}"' for q in range(b + 1, self.bands)])
                    )
            out.append((f"{self.port}_band{b}", rules))
        return out


def switch_ruleset(ports: Sequence[PortRules]) -> str:
    """``csb_switch``: every port's counters, virtual queues and chains, reached by ``oifname``."""
    lines = [f"table bridge {SWITCH_TABLE} {{"]
    for p in ports:
        lines += [f"    counter {name} {{ }}" for name in p.counters()]
        lines += [f"    limit {text}" for text in p.limits()]
    lines += ["    chain forward {", "        type filter hook forward priority 0; policy accept;"]
    lines += [f'        oifname "{p.port}" jump {p.port}' for p in ports]
    lines.append("    }")
    for p in ports:
        for name, rules in p.chains():
            lines += [f"    chain {name} {{", *(f"        {r}" for r in rules), "    }"]
    return "\n".join([*lines, "}", ""])


@dataclass(frozen=True)
class NftCounter:
    packets: int
    bytes: int


def parse_counters(json_text: str) -> dict[str, NftCounter]:
    """Named counters from ``nft -j list counters ...``: name -> packets, bytes (every table given, merged)."""
    try:
        items = json.loads(json_text or "{}").get("nftables", [])
    except json.JSONDecodeError as exc:
        raise ValueError(f"nft -j list counters: not JSON ({exc}): {json_text[:200]!r}") from None
    out = {}
    for item in items:
        c = item.get("counter") if isinstance(item, dict) else None
        if c is not None and "name" in c:
            out[str(c["name"])] = NftCounter(int(c.get("packets", 0)), int(c.get("bytes", 0)))
    return out
