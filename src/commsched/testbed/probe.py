"""Check what a testbed's links really deliver: TCP throughput and round-trip time between two ranks.

Run as ``python -m commsched.testbed.probe OUT.json [MiB]`` by ranks 0 and 1
(:func:`probe_link` does that): rank 1 sends ``MiB`` to rank 0 over one TCP
connection, then the two exchange 1-byte messages 200 times. Rank 0 writes
``{"throughput_mbit_s": ..., "rtt_ms": ...}`` (median RTT; throughput from the
first to the last byte received).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from commsched.testbed.base import Testbed
from commsched.testbed.launch import run_workers

_PINGS = 200
_CHUNK = 1 << 16


def _serve(port: int, nbytes: int) -> dict[str, float]:
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(60)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            got, first = 0, 0.0
            while got < nbytes:
                chunk = conn.recv(_CHUNK)
                if not chunk:
                    raise ConnectionError(f"peer closed after {got} of {nbytes} bytes")
                if not got:
                    first = time.perf_counter()
                got += len(chunk)
            elapsed = time.perf_counter() - first
            rtts = []
            for _ in range(_PINGS):
                t0 = time.perf_counter()
                conn.sendall(b"p")
                if conn.recv(1) != b"p":
                    raise ConnectionError("ping-pong broken")
                rtts.append(time.perf_counter() - t0)
    return {"throughput_mbit_s": nbytes * 8 / elapsed / 1e6, "rtt_ms": statistics.median(rtts) * 1e3}


def _send(addr: str, port: int, nbytes: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        block = b"\0" * _CHUNK
        sent = 0
        while sent < nbytes:
            n = min(_CHUNK, nbytes - sent)
            conn.sendall(block[:n])
            sent += n
        for _ in range(_PINGS):
            if conn.recv(1) != b"p":
                raise ConnectionError("ping-pong broken")
            conn.sendall(b"p")


def main() -> None:
    out, mib = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 32.0
    rank, port, nbytes = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"]), int(mib * 2**20)
    if rank == 0:
        out.write_text(json.dumps(_serve(port, nbytes)))
    elif rank == 1:
        _send(os.environ["MASTER_ADDR"], port, nbytes)


def probe_link(bed: Testbed, log_dir: Path, *, mib: float = 32.0, launch: int = 0) -> dict[str, float]:
    """Throughput (Mbit/s) from rank 1 to rank 0 and median RTT (ms), measured through the testbed."""
    out = log_dir / f"probe-{launch}.json"
    run_workers(
        bed,
        [sys.executable, "-m", "commsched.testbed.probe", str(out), str(mib)],
        log_dir=log_dir,
        timeout_s=120,
        ranks=[0, 1],
        name=f"probe-{launch}",
        launch=launch,
        fail_grace_s=2,
    )
    result: dict[str, float] = json.loads(out.read_text())
    out.unlink()
    return result


if __name__ == "__main__":
    main()
