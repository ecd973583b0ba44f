"""The fallback without root, and the choice of testbed: :func:`open_testbed`.

:class:`LoopbackTestbed` runs the same workers as plain processes on
127.0.0.1: no isolation, no shaping. :func:`open_testbed` builds a
:class:`~commsched.testbed.netns.NetnsTestbed` when it can and, with
``isolation="auto"``, falls back to the loopback testbed (and says so) when it cannot.

Example::

    with open_testbed(4, LinkShape(rate_bps=10**9)) as bed:
        run_workers(bed, [sys.executable, "-m", "my.worker"], log_dir=tmp, timeout_s=600)
"""

from __future__ import annotations

import os
from typing import Literal

from commsched._sockets import free_port
from commsched.testbed.base import Log, Testbed
from commsched.testbed.commands import LinkShape
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.system import TestbedError, _stderr, netns_unavailable_reason

Isolation = Literal["auto", "netns", "loopback"]


class LoopbackTestbed(Testbed):
    """No root: plain local processes talking over 127.0.0.1; nothing is isolated or shaped."""

    isolation = "loopback"

    def command(self, rank: int, argv: list[str]) -> list[str]:
        return list(argv)

    def env(self, slot: int, rank: int, world: int, master_slot: int, port: int) -> dict[str, str]:
        return {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "GLOO_SOCKET_IFNAME": "lo",
        }

    def master_port(self, launch: int) -> int:
        return free_port()

    def set_shape(self, shape: LinkShape) -> None:
        if shape.shaped:
            raise TestbedError(f"the loopback fallback cannot shape links (asked for {shape.label}); it needs root")
        self.shape = shape

    def describe(self) -> str:
        return f"{self.workers} local processes on 127.0.0.1 (loopback fallback: no namespaces, no shaping)"


def open_testbed(
    workers: int,
    shape: LinkShape | None = None,
    *,
    isolation: Isolation = "auto",
    mtu_bytes: int = 1500,
    log: Log = _stderr,
) -> Testbed:
    """A namespace testbed when possible; with ``isolation="auto"`` and no root, the loopback fallback.

    The fallback cannot shape: asking for shaping there raises :class:`TestbedError`. ``mtu_bytes`` is
    every veth's MTU (loopback's own, 65536, is larger than any).
    """
    if isolation == "netns":
        return NetnsTestbed(workers, shape, mtu_bytes=mtu_bytes, log=log)
    if isolation == "auto":
        reason = netns_unavailable_reason()
        if reason is None:
            return NetnsTestbed(workers, shape, mtu_bytes=mtu_bytes, log=log)
        log(f"testbed: {reason}; falling back to {workers} plain processes on 127.0.0.1, links NOT shaped")
    bed = LoopbackTestbed(workers)
    if shape is not None:
        bed.set_shape(shape)
    return bed
