"""Collectives over the direct connections (``commsched.transport.direct``), on real gloo ranks.

What is checked, each in its own spawned world (every spawn bounded by the harness of
test_collectives): the sum is the rank-order sum, bit for bit the same on every rank; the size
rule routes above ``DIRECT_MAX_BYTES`` to gloo among 3 ranks, and nothing between 2; a
reduce-scatter's shard is the rank-order sum of the ranks' chunks and an all-gather every rank's
shard, bit for bit, in place or not, interleaved with all-reduces (between 2 ranks through
``Collectives``, the ring left closed; among 3 on the connections themselves); strangers
that reach the listener while the mesh opens are rejected and the mesh still opens; connections
bind where told; starting never waits for the peer to read; an op completes without waiting once
its peers' frames are in, and not before; a frame out of sequence, a hung
peer and a dead peer each end ``wait()`` with a RuntimeCommError naming the op and the peer,
within the timeout.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_collectives import GROUP_TIMEOUT_S, _outcome, _spawn

from commsched.transport import TransportOptions, tcp_mesh
from commsched.transport import direct as D
from commsched.transport.collectives import Collectives
from commsched.transport.handles import WorkHandle

pytestmark = pytest.mark.multiproc


def _gathered(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return parts


def _sums_scenario(rank: int, world: int) -> dict[str, Any]:
    c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False)
    out: dict[str, Any] = {"digests": [], "rank_order": True}
    gen = torch.Generator().manual_seed(rank)
    sizes = (1, 3, 1000, 4096, D.DIRECT_MAX_BYTES // (4 * (world - 1)))
    inputs = [torch.randn(n, generator=gen) * 10.0 ** float(rank) for n in sizes]  # magnitudes differ by rank
    inputs.append(torch.randint(-5, 5, (777,), generator=gen, dtype=torch.int64))
    bufs = [x.clone() for x in inputs]
    handles = [c.all_reduce(b) for b in bufs]
    out["direct"] = [type(h).__name__ for h in handles]
    for h in reversed(handles):  # waiting for the last completes every one before it
        h.wait()
    for x, b in zip(inputs, bufs, strict=True):
        parts = _gathered(x, world)
        expected = parts[0].clone()
        for part in parts[1:]:
            expected += part
        out["rank_order"] &= bool(torch.equal(b, expected))
        out["digests"].append(hashlib.sha256(b.numpy().tobytes()).hexdigest())
    big = torch.ones(D.DIRECT_MAX_BYTES // (4 * (world - 1)) + 1)
    handle = c.all_reduce(big)
    out["big_to_gloo"] = isinstance(handle, WorkHandle)  # among 3; between 2 every size goes direct
    handle.wait()
    out["big_sum"] = bool(torch.equal(big, torch.full_like(big, world)))
    c.close()
    dist.barrier()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_small_all_reduces_give_the_rank_order_sum_bit_for_bit_on_every_rank(world: int) -> None:
    results = _spawn(_sums_scenario, world)
    for rank, res in results.items():
        assert "harness" not in res, res.get("harness")
        assert set(res["direct"]) == {"DirectHandle"}, res["direct"]
        assert res["rank_order"], f"rank {rank}: a sum differs from b_0 + b_1 + ... in rank order"
        assert res["big_to_gloo"] == (world > 2) and res["big_sum"], res
    assert len({tuple(res["digests"]) for res in results.values()}) == 1, "ranks hold different bits"


def _shards_scenario(rank: int, world: int) -> dict[str, Any]:
    """Reduce-scatters and all-gathers on the direct connections, interleaved with all-reduces: through
    ``Collectives`` between 2 ranks (the ring never opens), on the connections themselves among 3."""
    c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=True, open_ring=False)
    direct = c._direct
    assert direct is not None
    out: dict[str, Any] = {"routed": [], "rank_order": True, "gathered": True, "digests": []}
    gen = torch.Generator().manual_seed(rank)
    for i, n in enumerate((1, 7, 1000, 40_000)):
        flat = torch.randn(world * n, generator=gen) * 10.0 ** float(rank)
        before = flat.clone()
        in_place = i % 2 == 1  # the shard is this rank's chunk of flat, as the runtime's buffers keep it
        shard = flat.chunk(world)[rank] if in_place else torch.empty(n)
        ar = torch.randn(n + 3, generator=gen)
        ar_in = ar.clone()
        if world == 2:
            handles = [c.reduce_scatter(flat, shard), c.all_reduce(ar)]
        else:
            handles = [direct.start_reduce_scatter(flat, shard, "rs"), direct.start(ar, "ar")]
        out["routed"] += [type(h).__name__ for h in handles]
        handles[-1].wait()  # completes the reduce-scatter before it too
        parts = _gathered(before, world)
        expected = parts[0].chunk(world)[rank].clone()
        for part in parts[1:]:
            expected += part.chunk(world)[rank]
        out["rank_order"] &= bool(torch.equal(shard, expected))
        ar_parts = _gathered(ar_in, world)
        out["rank_order"] &= bool(torch.equal(ar, sum(ar_parts[1:], ar_parts[0].clone())))
        if not in_place:
            out["rank_order"] &= bool(torch.equal(flat, before))  # a reduce-scatter only reads flat
        gathered = flat if in_place else torch.empty(world * n)
        handle = c.all_gather(shard, gathered) if world == 2 else direct.start_all_gather(shard, gathered, "ag")
        out["routed"].append(type(handle).__name__)
        handle.wait()
        out["gathered"] &= bool(torch.equal(gathered, torch.cat(_gathered(shard, world))))
        out["digests"].append(hashlib.sha256(gathered.numpy().tobytes()).hexdigest())
    out["ring_open"] = c._ring_open
    c.close()
    dist.barrier()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatters_and_all_gathers_give_the_rank_order_sum_and_every_shard_bit_for_bit(world: int) -> None:
    results = _spawn(_shards_scenario, world)
    for rank, res in results.items():
        assert "harness" not in res, res.get("harness")
        assert set(res["routed"]) == {"DirectHandle"}, res["routed"]
        assert res["rank_order"], f"rank {rank}: a sum differs from b_0 + b_1 + ... in rank order"
        assert res["gathered"], f"rank {rank}: an all-gather is not every rank's shard in rank order"
        assert res["ring_open"] is False, res
    assert len({tuple(res["digests"]) for res in results.values()}) == 1, "ranks hold different bits"


def _strangers_scenario(rank: int, world: int) -> dict[str, Any]:
    """Two strangers reach rank 1's listener before rank 0 dials: one sends junk, one stays silent."""
    strangers: list[socket.socket] = []
    real_share = tcp_mesh.share_addresses

    def share(*args: Any) -> Any:
        key, infos = real_share(*args)
        if rank == 1:
            for junk in (b"GET / HTTP/1.0\r\n\r\n" * 8, b""):
                s = socket.create_connection(tuple(infos[1][:2]))
                if junk:
                    s.sendall(junk)
                strangers.append(s)
        else:
            time.sleep(1.0)  # rank 0 dials after the strangers are queued
        return key, infos

    tcp_mesh.share_addresses = share  # type: ignore[assignment]
    D.HANDSHAKE_S = 0.5
    out: dict[str, Any] = {}
    try:
        c = Collectives(
            dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False, options=TransportOptions(bind="127.0.0.1")
        )
        assert c._direct is not None
        out["rejected"] = c._direct.rejected
        out["bound"] = sorted({s.getsockname()[0] for s in c._direct.peers.values()})
        x = torch.full((10,), float(rank + 1))
        c.all_reduce(x).wait()
        out["sum"] = x.tolist()
        dist.barrier()
        c.close()
    except Exception:
        out["error"] = traceback.format_exc()
    for s in strangers:
        s.close()
    return out


def test_strangers_are_rejected_the_mesh_opens_and_binds_where_told() -> None:
    results = _spawn(_strangers_scenario, 2)
    for res in results.values():
        assert "error" not in res and "harness" not in res, res
        assert res["sum"] == [3.0] * 10
        assert res["bound"] == ["127.0.0.1"], res
    assert results[1]["rejected"] == 2, results[1]


def _faults_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 first sends a frame out of sequence, then stays silent, then exits."""

    out: dict[str, Any] = {}
    garbled = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False)
    hung = Collectives(dist.new_group(), timeout_s=2.0, ring=False)
    dying = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False)
    assert garbled._direct is not None
    if rank == 1:
        garbled._direct.peers[0].sendall(D.FRAME.pack(D.MAGIC, 7, 40) + bytes(40))  # op 7, not op 0
        time.sleep(4.0)
        os._exit(1)  # without a frame for ``dying``
    first = garbled.all_reduce(torch.ones(10))
    out["out_of_sequence"] = _outcome(first.wait)
    out["after_it"] = _outcome(garbled.all_reduce(torch.ones(10)).wait)
    handle = hung.all_reduce(torch.ones(10))
    out["bounded_by_caller"] = _outcome(lambda: handle.wait(timeout_s=0.5))
    out["bounded_by_timeout_s"] = _outcome(hung.all_reduce(torch.ones(10)).wait)
    out["dead_peer"] = _outcome(dying.all_reduce(torch.ones(100)).wait)
    return out


def test_a_frame_out_of_sequence_a_hung_and_a_dead_peer_end_wait_with_a_clear_error() -> None:
    survivor = _spawn(_faults_scenario, 2, reporters=(0,))[0]
    assert "harness" not in survivor, survivor.get("harness")
    garbled = survivor["out_of_sequence"]
    assert garbled["error"] is not None and "rank 1 sent a frame for another op" in garbled["error"], garbled
    assert "op 7" in garbled["error"] and "all_reduce" in garbled["error"], garbled
    assert survivor["after_it"]["error"] == garbled["error"], survivor["after_it"]  # and every op after it
    caller = survivor["bounded_by_caller"]
    assert caller["error"] is not None and "0.5 s" in caller["error"] and caller["elapsed_s"] < 2.0, caller
    own = survivor["bounded_by_timeout_s"]  # the op before it already failed: at once
    assert own["error"] is not None and own["elapsed_s"] < 1.0, own
    dead = survivor["dead_peer"]
    assert dead["error"] is not None and "rank 1" in dead["error"], dead
    assert "not a RuntimeCommError" not in dead["error"] and dead["elapsed_s"] < 10.0, dead


def _leader_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 0 starts 40 ops of 1 MiB (far more than the sockets hold) before it tells rank 1 to start them,
    as a leader sends its decisions after starting the ops they name: starting must not wait for the peer."""
    c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False)
    bufs = [torch.full((D.DIRECT_MAX_BYTES // 4,), float(rank + i)) for i in range(40)]
    go = torch.zeros(1)
    handles = []
    if rank == 0:
        handles = [c.all_reduce(b) for b in bufs]
        dist.broadcast(go, src=0)  # the "decision", after the starts
    else:
        dist.broadcast(go, src=0)
        handles = [c.all_reduce(b) for b in bufs]
    for h in handles:
        h.wait()
    out = {"sums": all(bool(torch.equal(b, torch.full_like(b, float(2 * i + 1)))) for i, b in enumerate(bufs))}
    c.close()
    dist.barrier()
    return out


def test_starting_never_waits_for_the_peer_to_read() -> None:
    results = _spawn(_leader_scenario, 2)
    for res in results.values():
        assert "harness" not in res, res.get("harness")
        assert res["sums"], res


def _try_complete_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 starts its op only after rank 0 has tried to complete its own: that try cannot finish it; once
    rank 1's frame is there, a try completes it (and the op before it, which nobody waited for)."""
    c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=False)
    first, second = torch.full((1000,), float(rank + 1)), torch.full((3,), float(10 * (rank + 1)))
    out: dict[str, Any] = {}
    if rank == 0:
        h1, h2 = c.all_reduce(first), c.all_reduce(second)
        out["before_peer"] = h2.try_complete()
        dist.barrier()  # rank 1 starts its ops after this
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        while not h2.try_complete() and time.monotonic() < deadline:
            time.sleep(0.001)  # never blocks: polled until the peer's frames are in
        out["completed"] = h1.is_completed() and h2.is_completed()
        h2.wait()
    else:
        dist.barrier()
        h1, h2 = c.all_reduce(first), c.all_reduce(second)
        h2.wait()
    out["sums"] = first.tolist() == [3.0] * 1000 and second.tolist() == [30.0] * 3
    out["small_fits"] = h2.fits_buffers()
    assert c._direct is not None
    out["huge_fits"] = c._direct.fits_buffers(1 << 30)
    c.close()
    dist.barrier()
    return out


def test_try_complete_never_blocks_and_completes_once_the_peers_frames_are_in() -> None:
    results = _spawn(_try_complete_scenario, 2)
    for res in results.values():
        assert "harness" not in res, res.get("harness")
        assert res["sums"] and res["small_fits"] and not res["huge_fits"], res
    assert results[0]["before_peer"] is False and results[0]["completed"], results[0]
