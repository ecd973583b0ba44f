"""open_dlcp_link over a real gloo group of 2 processes: addresses and the key exchanged, then transfers."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from _processes import run_ranks

from commsched.errors import RuntimeCommError
from commsched.transport import TransportOptions
from commsched.transport.dlcp.link import open_dlcp_link
from commsched.transport.links import TransferKey

pytestmark = pytest.mark.multiproc


def _rank(rank: int, world: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    peer = 1 - rank
    gc.unfreeze()
    # no bind given: the address that routes to MASTER_ADDR (127.0.0.1 here); the key is drawn by rank 0
    with open_dlcp_link(None, 10.0) as link:
        result["bind"] = link._engine._peers[rank].control[0]
        sent = torch.arange(50_000, dtype=torch.float32) + 1000 * rank
        out = torch.empty(50_000)
        recv = link.recv(peer, TransferKey(0, 0, 0), out)
        link.send(peer, TransferKey(0, 0, 0), sent).wait(10.0)
        result["lost"] = recv.wait(10.0).lost
        result["exact"] = torch.equal(out, torch.arange(50_000, dtype=torch.float32) + 1000 * peer)
        result["frozen_with"] = gc.get_freeze_count()
    result["frozen_after"] = gc.get_freeze_count()
    options = TransportOptions(bind="127.0.0.1", key=bytes(32), freeze_gc=False)
    with open_dlcp_link(None, 10.0, options, mtu_bytes=9000) as link:
        result["frozen_without"] = gc.get_freeze_count()
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
    return result


def test_open_dlcp_link_exchanges_addresses_and_key_over_gloo() -> None:
    results = run_ranks(_rank, 2, group_timeout_s=20.0, within_s=90.0)
    for rank, result in results.items():
        assert result["bind"] == "127.0.0.1"
        assert result["lost"] == 0 and result["exact"] and result["jumbo_exact"], (rank, result)
        assert "different keys" in result["mismatch"]
        # the link keeps the objects alive at its opening out of the collector's passes unless told not to
        assert result["frozen_with"] > 1000 and result["frozen_without"] == 0, (rank, result)
        assert result["frozen_after"] == 0, (rank, result)  # given back to the collector when the link closed
