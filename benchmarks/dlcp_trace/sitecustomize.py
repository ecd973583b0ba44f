"""Record when each DLCP exchange of a process posts, sends, receives and ends, for every Python process started
with this folder on PYTHONPATH.

    DLCP_TRACE_DIR=OUT PYTHONPATH=benchmarks/dlcp_trace:src python benchmarks/dlcp_tails.py --methods dlcp ...

Each process that used a DLCP link writes ``OUT/trace.<pid>.json`` when it exits: its ``RANK`` and a list of
events ``[kind, time.monotonic(), ...]``: ``x`` an exchange's ``start`` called (task id), ``p`` a transfer posted
(``S`` or ``R``, task, phase), ``f`` a transfer ended (the same), ``s`` a batch of data datagrams handed to the
kernel (bytes), ``r`` a read of the data sockets (bytes: one datagram or a GRO batch). ``benchmarks/
dlcp_round_trace.py`` sets them beside a tails run's rounds. Each event costs the process about a microsecond.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

_DIR = Path(os.environ.get("DLCP_TRACE_DIR", "/tmp/dlcp-trace"))
_events: list[list[Any]] = []
_SMALL = 1000  # bytes: control datagrams are shorter, data datagrams (and GRO batches of them) longer


def _install() -> None:
    from commsched.transport import exchange
    from commsched.transport.dlcp import engine, link, udp

    send_batch, read, post = udp.send_batch, udp.DatagramReader.read, engine.Engine.post
    finish, start = link.DlcpTransfer.finish, exchange.PsExchange.start

    def traced_send_batch(sock: Any, parts: Any, *args: Any) -> Any:
        t = time.monotonic()
        out = send_batch(sock, parts, *args)
        n = sum(len(p) for p in parts)
        if n > _SMALL:
            _events.append(["s", t, n])
        return out

    def traced_read(self: Any) -> Any:
        out = read(self)
        if out[0] > _SMALL:
            _events.append(["r", time.monotonic(), out[0]])
        return out

    def traced_post(self: Any, slot: Any, transfer: Any) -> Any:
        _events.append(["p", time.monotonic(), type(slot).__name__[0], slot.key.task, slot.key.phase])
        return post(self, slot, transfer)

    def traced_finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.is_completed():
            slot = self.slot
            _events.append(["f", time.monotonic(), type(slot).__name__[0], slot.key.task, slot.key.phase])
        return finish(self, *args, **kwargs)

    def traced_start(self: Any, task: Any, buffer: Any) -> Any:
        _events.append(["x", time.monotonic(), task.id])
        return start(self, task, buffer)

    patches = (
        (udp, "send_batch", traced_send_batch),
        (udp.DatagramReader, "read", traced_read),
        (engine.Engine, "post", traced_post),
        (link.DlcpTransfer, "finish", traced_finish),
        (exchange.PsExchange, "start", traced_start),
    )
    for owner, name, traced in patches:
        setattr(owner, name, traced)


def _dump() -> None:
    if not any(e[0] == "p" for e in _events):
        return  # a process without a DLCP link (the launcher, a gloo rank)
    _DIR.mkdir(parents=True, exist_ok=True)
    trace = {"rank": int(os.environ.get("RANK", "-1")), "events": _events}
    (_DIR / f"trace.{os.getpid()}.json").write_text(json.dumps(trace))


try:
    _install()
except ImportError:  # commsched not importable in this process: nothing to trace
    pass
else:
    atexit.register(_dump)
