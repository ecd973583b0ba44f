"""Switch ports on a live testbed (root): strict priority by DSCP, ECT marked and not-ECT dropped past K, loss.

:func:`apply_switch` turns bridge ports of a
:class:`~commsched.testbed.netns.NetnsTestbed` into ports of the shape
:class:`SwitchShape` describes (tc on the port, nftables rules in the
bridge namespace: :mod:`commsched.testbed.ports` builds both);
:func:`port_counters` reads back what each band sent, marked and dropped.
The kernel is asked first (:mod:`commsched.testbed.kernel`), and a shape it
cannot build is refused naming what is missing.

    shape = SwitchShape(rate_bps=300 * 10**6, queue_pkts=20, loss_pct=1.0)   # aqm="virtual"
    with NetnsTestbed(4) as bed:
        apply_switch(bed, shape)
        ...
        print(port_counters(bed, rank=0, shape=shape))
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from commsched.testbed import kernel
from commsched.testbed.base import Log
from commsched.testbed.counters import BandCounters, BridgeBytes, band_counters, parse_port_bytes
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.nft import SWITCH_TABLE, parse_counters, switch_ruleset
from commsched.testbed.ports import (
    AQMS,
    DSCP_IMPORTANT,
    DSCP_UNIMPORTANT,
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    Aqm,
    OffloadTool,
    SwitchShape,
    offload_commands,
    port_commands,
    port_rules,
    red_args,
    tos_byte,
)
from commsched.testbed.system import TestbedError, run_command

__all__ = [
    "AQMS",
    "DSCP_IMPORTANT",
    "DSCP_UNIMPORTANT",
    "ECN_CE",
    "ECN_ECT0",
    "ECN_ECT1",
    "ECN_NOT_ECT",
    "Aqm",
    "OffloadTool",
    "SwitchShape",
    "apply_switch",
    "bridge_bytes",
    "disable_offloads",
    "needed_features",
    "offload_commands",
    "offload_tool",
    "port_commands",
    "port_counters",
    "red_args",
    "switch_unavailable_reason",
    "tos_byte",
]


_VIRTUAL = "aqm='virtual' marks and drops without them (a virtual queue in nftables, see docs/testbed.md)"
_HINTS = {
    "prio": _VIRTUAL,
    "red": _VIRTUAL,
    "netem": "the testbed has no other way to delay packets: leave delay_ms and jitter_ms at 0",
}


def needed_features(shape: SwitchShape) -> list[str]:
    """The kernel features (:data:`commsched.testbed.kernel.FEATURES`) a port of ``shape`` is built with."""
    out = ["htb", "u32"]
    out += ["prio", "red"] if shape.aqm == "red" else []
    out += ["nft"] if shape.needs_nft else []
    return out + (["netem"] if shape.needs_netem else [])


def switch_unavailable_reason(shape: SwitchShape) -> str | None:
    """Why ``shape`` cannot be built here (None when it can): no namespaces, no ``nft``, kernel features missing."""
    return kernel.unavailable_reason(needed_features(shape), f"the switch port {shape.label}", _HINTS)


def offload_tool() -> OffloadTool:
    """``ethtool`` when installed, else ``ip`` (iproute2, which the testbed needs anyway)."""
    return "ethtool" if shutil.which("ethtool") else "ip"


def disable_offloads(bed: NetnsTestbed, tool: OffloadTool | None = None, log: Log | None = None) -> OffloadTool:
    """Make every veth of ``bed`` carry MTU-sized packets (see :func:`offload_commands`); returns the tool used."""
    tool = tool or offload_tool()
    if tool == "ip" and log is not None:
        log("testbed: ethtool not found (apt-get install ethtool); capping GSO with `ip link ... gso_max_segs 1`")
    for argv in offload_commands(bed.layout, tool, bed.layout.mtu_bytes):
        run_command(argv)
    return tool


def apply_switch(bed: NetnsTestbed, shape: SwitchShape, *, ranks: Sequence[int] | None = None) -> None:
    """Make the bridge ports toward ``ranks`` (default: every worker, on every path) switch ports of ``shape``.

    Turns offloads off on every link first. Replaces what
    :meth:`NetnsTestbed.set_shape` put on those ports (the worker side keeps
    its shaping) and what an earlier call put there; ports toward other ranks
    keep theirs. ``bed.set_shape(bed.shape)`` puts plain links back. Raises
    :class:`TestbedError` with the reason when this kernel cannot build it.
    """
    reason = switch_unavailable_reason(shape)
    if reason is not None:
        raise TestbedError(reason)
    disable_offloads(bed, log=bed.log)
    ns = bed.layout.bridge_ns
    for r in range(bed.workers) if ranks is None else ranks:
        for p in range(bed.layout.paths):
            port = bed.layout.bridge_port(r, p)
            run_command(["tc", "-n", ns, "qdisc", "del", "dev", port, "root"], check=False)
            for argv in port_commands(ns, port, shape):
                run_command(argv)
            rules = port_rules(shape, port)
            if rules is None:
                bed.switch_rules.pop(port, None)
            else:
                bed.switch_rules[port] = rules
    load_switch_rules(bed)


def load_switch_rules(bed: NetnsTestbed) -> None:
    """Replace the bridge's ``csb_switch`` table by the rules of ``bed.switch_rules`` (none: no table)."""
    nft = ["ip", "netns", "exec", bed.layout.bridge_ns, "nft"]
    if shutil.which("nft") is not None:
        run_command([*nft, "delete", "table", "bridge", SWITCH_TABLE], check=False)
    if bed.switch_rules:
        run_command([*nft, "-f", "-"], stdin_text=switch_ruleset(list(bed.switch_rules.values())))


def port_counters(bed: NetnsTestbed, rank: int, shape: SwitchShape, path: int = 0) -> list[BandCounters]:
    """Per band counters of the switch port toward worker ``rank`` on ``path``: tc's, plus its nftables counters.

    ``dropped`` counts every drop of the band's frames at the port: random
    loss (``lost``), at the threshold (``early``) and at the buffer (``pdrop``).
    """
    port = bed.layout.bridge_port(rank, path)
    ns = bed.layout.bridge_ns
    bands = band_counters(run_command(["tc", "-n", ns, "-s", "qdisc", "show", "dev", port]), shape.bands)
    rules = bed.switch_rules.get(port)
    if rules is None:
        return bands
    listed = run_command(["ip", "netns", "exec", ns, "nft", "-j", "list", "counters", "table", "bridge", SWITCH_TABLE])
    nft = parse_counters(listed)

    def count(what: str, band: int) -> int:
        c = nft.get(rules.counter(what, band))
        return 0 if c is None else c.packets

    out = []
    for b in bands:
        lost, marked, early = (count(what, b.band) for what in ("lost", "marked", "early"))
        out.append(
            BandCounters(
                band=b.band,
                sent_pkts=b.sent_pkts,
                sent_bytes=b.sent_bytes,
                dropped=b.dropped + lost + early,
                marked=b.marked + marked,
                early=b.early + early,
                pdrop=b.pdrop,
                lost=lost,
            )
        )
    return out


def bridge_bytes(bed: NetnsTestbed) -> list[BridgeBytes]:
    """Bytes carried by each bridge (one per path), summed over its ports."""
    out = []
    for p in range(bed.layout.paths):
        bridge = bed.layout.bridge_dev(p)
        text = run_command(["ip", "-n", bed.layout.bridge_ns, "-s", "-j", "link", "show", "master", bridge])
        out.append(BridgeBytes(bridge, *parse_port_bytes(text)))
    return out
