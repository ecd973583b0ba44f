"""A free TCP port for a local rendezvous (the launchers of local runs and the benchmarks' two-process jobs)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on now (another process may take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
