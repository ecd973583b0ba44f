"""Reading the testbed's counters: ``tc -s qdisc show`` and ``ip -s -j link show`` output, parsed.

Pure functions on the commands' text, so they are tested on recorded output.
A switch port (:mod:`commsched.testbed.switch`) keeps each band's counters in
its leaf qdisc, handle :func:`band_handle`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


def band_handle(band: int) -> str:
    """The handle of band ``band``'s leaf qdisc (where its counters are): ``10:``, ``11:``, ..."""
    return f"{0x10 + band:x}:"


@dataclass(frozen=True)
class QdiscStats:
    """One qdisc of ``tc -s qdisc show``; ``marked``/``early``/``pdrop`` are RED's (0 for other kinds)."""

    kind: str
    handle: str
    parent: str  # "root" or the parent class, e.g. "3:1"
    sent_bytes: int
    sent_pkts: int
    dropped: int
    overlimits: int
    backlog_pkts: int
    marked: int = 0
    early: int = 0
    pdrop: int = 0


_HEAD_RE = re.compile(r"^qdisc (\S+) (\S+) (?:(root)|parent (\S+))")
_SENT_RE = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")
_BACKLOG_RE = re.compile(r"backlog \S+ (\d+)p")
_RED_RE = re.compile(r"marked (\d+) early (\d+) pdrop (\d+)")


def parse_qdisc_stats(text: str) -> list[QdiscStats]:
    """Every qdisc in the output of ``tc -s qdisc show dev <dev>``, in order."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("qdisc "):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    out = []
    for block in blocks:
        head, body = _HEAD_RE.match(block[0]), "\n".join(block)
        sent, backlog, red = _SENT_RE.search(body), _BACKLOG_RE.search(body), _RED_RE.search(body)
        if head is None or sent is None:
            raise ValueError(
                f"tc -s qdisc show: cannot read {block[0]!r} (expected 'qdisc KIND HANDLE ...' and 'Sent')"
            )
        sent_bytes, sent_pkts, dropped, overlimits = (int(x) for x in sent.groups())
        marked, early, pdrop = (int(x) for x in red.groups()) if red else (0, 0, 0)
        out.append(
            QdiscStats(
                kind=head.group(1),
                handle=head.group(2),
                parent="root" if head.group(3) else head.group(4),
                sent_bytes=sent_bytes,
                sent_pkts=sent_pkts,
                dropped=dropped,
                overlimits=overlimits,
                backlog_pkts=int(backlog.group(1)) if backlog else 0,
                marked=marked,
                early=early,
                pdrop=pdrop,
            )
        )
    return out


def parse_port_bytes(json_text: str) -> tuple[int, int]:
    """(received, transmitted) bytes summed over the ports in ``ip -s -j link show master <bridge>``."""
    rx = tx = 0
    for link in json.loads(json_text or "[]"):
        stats = link.get("stats64") or link.get("stats") or {}
        rx += int(stats.get("rx", {}).get("bytes", 0))
        tx += int(stats.get("tx", {}).get("bytes", 0))
    return rx, tx


@dataclass(frozen=True)
class BandCounters:
    """What one band of a port did: sent; dropped (all causes); marked CE; dropped at the threshold (``early``),
    at the buffer limit (``pdrop``) and at random (``lost``)."""

    band: int
    sent_pkts: int
    sent_bytes: int
    dropped: int
    marked: int
    early: int
    pdrop: int
    lost: int = 0


def band_counters(text: str, bands: int) -> list[BandCounters]:
    """Per band, from ``tc -s qdisc show`` of a switch port (the leaf qdisc ``band_handle(b)`` of each band).

    A RED leaf counts its own marks, early drops and ``pdrop``; a fifo leaf
    drops only at its limit, so its drops are the band's ``pdrop``.
    """
    by_handle = {q.handle: q for q in parse_qdisc_stats(text)}
    out = []
    for b in range(bands):
        q = by_handle.get(band_handle(b))
        if q is None:
            raise ValueError(f"band {b}: no qdisc with handle {band_handle(b)} (is this a switch port?)")
        pdrop = q.pdrop if q.kind == "red" else q.dropped
        out.append(BandCounters(b, q.sent_pkts, q.sent_bytes, q.dropped, q.marked, q.early, pdrop))
    return out


@dataclass(frozen=True)
class BridgeBytes:
    """What one bridge (one path) carried: bytes its ports received from hosts and delivered to hosts."""

    bridge: str
    from_hosts_bytes: int
    to_hosts_bytes: int
