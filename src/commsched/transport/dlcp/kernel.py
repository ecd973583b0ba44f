"""The kernel's count of UDP datagrams it dropped on receive, read from ``/proc``.

A datagram that reaches a host is still lost when its socket's receive
buffer is full (the receiving thread stalled: GIL, GC, a busy core). Linux
counts those drops twice over:

* per network namespace, ``RcvbufErrors`` of the ``Udp:`` row of
  ``/proc/net/snmp`` plus ``Udp6RcvbufErrors`` of ``/proc/net/snmp6`` (every
  UDP socket of the namespace: on a host where several ranks share one
  namespace, all of theirs);
* per socket, the ``drops`` column of ``/proc/net/udp`` and
  ``/proc/net/udp6`` (receive-buffer overflows, and the rarer drops for a bad
  checksum or a socket filter), found here by local port.

Both are cumulative since boot (or since the socket opened); callers take
differences. Each function returns None where ``/proc`` cannot be read (not
Linux, or a sandbox that hides it).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from pathlib import Path

PROC_NET = Path("/proc/net")


def udp_rcvbuf_errors(proc_net: Path = PROC_NET) -> int | None:
    """Datagrams the namespace's UDP sockets dropped for a full receive buffer (IPv4 + IPv6), or None."""
    try:
        lines = (proc_net / "snmp").read_text().splitlines()
    except OSError:
        return None
    total: int | None = None
    for names, values in itertools.pairwise(lines):
        if names.startswith("Udp: ") and values.startswith("Udp: "):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            if "RcvbufErrors" in row:
                total = int(row["RcvbufErrors"])
            break
    if total is None:
        return None
    try:
        for line in (proc_net / "snmp6").read_text().splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0] == "Udp6RcvbufErrors":
                total += int(fields[1])
    except OSError:
        pass  # no IPv6 in this namespace: IPv4's count is the count
    return total


def udp_socket_drops(ports: Collection[int], proc_net: Path = PROC_NET) -> int | None:
    """The ``drops`` of the UDP sockets bound to local ``ports`` (IPv4 and IPv6), summed; None if unreadable."""
    wanted = set(ports)
    total, read = 0, False
    for name in ("udp", "udp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 12 and int(fields[1].rsplit(":", 1)[1], 16) in wanted:
                total += int(fields[-1])
    return total if read else None
