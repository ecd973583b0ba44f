"""open_dlcp_link over a real gloo group of 2 processes: addresses and the key exchanged, then transfers."""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _processes import context, process

from commsched.errors import RuntimeCommError
from commsched.transport import TransportOptions
from commsched.transport.dlcp.link import open_dlcp_link
from commsched.transport.links import TransferKey

pytestmark = pytest.mark.multiproc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, report: Any) -> None:
    result: dict[str, Any] = {}
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=20)
        )
        peer = 1 - rank
        # no bind given: the address that routes to MASTER_ADDR (as torchrun sets it); the key is drawn by rank 0
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        with open_dlcp_link(None, 10.0) as link:
            result["bind"] = link._engine._peers[rank].control[0]
            sent = torch.arange(50_000, dtype=torch.float32) + 1000 * rank
            out = torch.empty(50_000)
            recv = link.recv(peer, TransferKey(0, 0, 0), out)
            link.send(peer, TransferKey(0, 0, 0), sent).wait(10.0)
            result["lost"] = recv.wait(10.0).lost
            result["exact"] = torch.equal(out, torch.arange(50_000, dtype=torch.float32) + 1000 * peer)
        with open_dlcp_link(None, 10.0, TransportOptions(bind="127.0.0.1", key=bytes(32)), mtu_bytes=9000) as link:
            sent = torch.randn(70_000, generator=torch.Generator().manual_seed(rank))
            out = torch.empty(70_000)
            recv = link.recv(peer, TransferKey(1, 0, 0), out)
            link.send(peer, TransferKey(1, 0, 0), sent).wait(10.0)
            recv.wait(10.0)
            result["jumbo_exact"] = torch.equal(out, torch.randn(70_000, generator=torch.Generator().manual_seed(peer)))
        try:
            open_dlcp_link(None, 10.0, TransportOptions(bind="127.0.0.1", key=bytes([rank]) * 32))
            result["mismatch"] = "opened"
        except RuntimeCommError as exc:
            result["mismatch"] = str(exc)
    except BaseException:
        result["error"] = traceback.format_exc()
    report.put((rank, result))
    report.close()
    report.join_thread()
    os._exit(0)


def test_open_dlcp_link_exchanges_addresses_and_key_over_gloo() -> None:
    report = context().Queue()
    port = _free_port()
    procs = [process(_rank, (r, port, report)) for r in range(2)]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    try:
        while len(results) < 2:
            try:
                rank, result = report.get(timeout=1.0)
            except queue.Empty:
                missing = sorted({0, 1} - results.keys())
                if time.monotonic() > deadline or all(procs[r].exitcode is not None for r in missing):
                    pytest.fail(f"ranks {missing} did not report")
                continue
            results[rank] = result
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    for rank, result in results.items():
        assert "error" not in result, result["error"]
        assert result["bind"] == "127.0.0.1"
        assert result["lost"] == 0 and result["exact"] and result["jumbo_exact"], (rank, result)
        assert "different keys" in result["mismatch"]
