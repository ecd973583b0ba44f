"""TcpLink and the ps transport on real processes (gloo on 127.0.0.1 for the set-up, TCP for the data).

Each scenario runs inside spawned ranks and reports a dict per rank; every
spawn is bounded, so a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _processes import run_ranks
from test_collectives import _outcome

from commsched.errors import RuntimeCommError
from commsched.schedule.base import CommTask, Segment
from commsched.transport import TRANSPORTS, TaskBuffer, TransportOptions, wire
from commsched.transport.links import TransferKey
from commsched.transport.ps import PsTransport
from commsched.transport.tcp import TcpLink

pytestmark = pytest.mark.multiproc

SPAWN_TIMEOUT_S = 90.0
TIMEOUT_S = 15.0
KEY = b"k" * 32


# ---------------------------------------------------------------------- harness


def _spawn(
    target: Callable[[int, int], dict[str, Any]], world: int, reporters: tuple[int, ...] | None = None
) -> dict[int, dict[str, Any]]:
    return run_ranks(target, world, group_timeout_s=TIMEOUT_S, within_s=SPAWN_TIMEOUT_S, reporters=reporters)


def _task(task_id: int, kind: str, numel: int, deps: tuple[int, ...] = ()) -> CommTask:
    return CommTask(task_id, kind, (Segment(0, 0, numel),), 4 * numel, f"t{task_id}", 0, deps, "ps")  # type: ignore[arg-type]


def _rank_order_sum(x: torch.Tensor, world: int) -> torch.Tensor:
    """What the owners compute: the ranks' tensors added in rank order."""
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


# ---------------------------------------------------------------------- scenarios (inside the ranks)


def _sums_scenario(rank: int, world: int) -> dict[str, Any]:
    """Pushes and pulls of several sizes, overlapping, pulls started as pushes finish, three steps."""
    transport = TRANSPORTS["ps"](None, TIMEOUT_S, TransportOptions())
    assert isinstance(transport, PsTransport)
    sizes = [1, 5, 100_003, 7, 4096]
    pushes = [_task(2 * i, "push", n) for i, n in enumerate(sizes)]
    pulls = [_task(2 * i + 1, "pull", n, deps=(2 * i,)) for i, n in enumerate(sizes)]
    wrong = []
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        flats = [torch.randn(n, generator=gen) for n in sizes]
        expected = [_rank_order_sum(f, world) for f in flats]
        pushed = [transport.start(t, TaskBuffer(f)) for t, f in zip(pushes, flats, strict=True)]
        pulled = []
        for i in (2, 0, 4, 1, 3):  # the same start order on every rank, not the push order
            pushed[i].wait(TIMEOUT_S)
            pulled.append((i, transport.start(pulls[i], TaskBuffer(flats[i]))))
        random.Random(rank + step).shuffle(pulled)  # each rank waits in its own order
        for i, handle in pulled:
            handle.wait(TIMEOUT_S)
            if not torch.equal(flats[i], expected[i]):
                wrong.append((step, i))
    # the collective kinds through the same transport: all-reduce, then reduce-scatter + all-gather
    flat = torch.arange(12.0) * (rank + 1)
    transport.start(_task(20, "all_reduce", 12), TaskBuffer(flat)).wait(TIMEOUT_S)
    padded, shard = torch.arange(4.0 * world) + rank, torch.zeros(4)
    reference = _rank_order_sum(padded, world)
    transport.start(_task(21, "reduce_scatter", 4 * world), TaskBuffer(padded, shard)).wait(TIMEOUT_S)
    shard_ok = torch.equal(shard, reference[4 * rank : 4 * rank + 4])
    transport.start(_task(22, "all_gather", 4 * world, (21,)), TaskBuffer(padded, shard)).wait(TIMEOUT_S)
    out = {
        "wrong": wrong,
        "all_reduce": torch.equal(flat, torch.arange(12.0) * sum(range(1, world + 1))),
        "shard": shard_ok,
        "gathered": torch.equal(padded, reference),
        "dropped": dict(transport.link.dropped),
        "bind": transport.link.address[0],
    }
    dist.barrier()
    transport.close()
    return out


def _bind_scenario(rank: int, world: int) -> dict[str, Any]:
    gc.unfreeze()
    unfrozen = TcpLink(None, TIMEOUT_S, TransportOptions(bind="127.0.0.2", freeze_gc=False))
    kept_out = gc.get_freeze_count()
    unfrozen.close()
    link = TcpLink(None, TIMEOUT_S, TransportOptions(bind="127.0.0.2"))
    frozen = gc.get_freeze_count()
    data = torch.full((100,), float(rank))
    out = torch.zeros(100)
    peer = 1 - rank
    sent, got = link.send(peer, TransferKey(0, 0, 0), data), link.recv(peer, TransferKey(0, 0, 0), out)
    sent.wait(), got.wait()
    result = {"address": link.address[0], "received": out.tolist() == [float(peer)] * 100}
    result |= {"frozen_without": kept_out, "frozen_with": frozen}
    dist.barrier()
    link.close()
    result["frozen_after"] = gc.get_freeze_count()
    return result


def _wrong_key_scenario(rank: int, world: int) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        TcpLink(None, 5.0, TransportOptions(key=bytes([rank + 1]) * 32))
        return {"error": None}
    except RuntimeCommError as exc:
        return {"error": str(exc), "elapsed_s": time.monotonic() - t0}


def _raw(address: tuple[str, int], key: bytes) -> socket.socket:
    """A connection to ``address`` that claims to be rank 1 and proves ``key``."""
    sock = socket.create_connection(address, timeout=5.0)
    wire.dial(sock, key, 1, 0, "raw test connection")
    return sock


def _frame(step: int, task: int, phase: int, code: int, numel: int, payload: bytes, nbytes: int | None = None) -> bytes:
    size = len(payload) if nbytes is None else nbytes
    return wire.HEADER.pack(wire.MAGIC, size, step, task, phase, code, numel) + payload


def _malformed_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 0 is attacked by raw connections that hold the key (and one that does not); the link keeps working."""
    link = TcpLink(None, TIMEOUT_S, TransportOptions(key=KEY), unposted_cap_bytes=1000)
    k1, k2, k3, k4 = (TransferKey(0, t, 0) for t in range(1, 5))
    result: dict[str, Any] = {}
    if rank == 0:
        buffer = torch.full((14,), -1.0)  # 2 sentinels each side of the 10 elements posted
        got = link.recv(1, k1, buffer[2:12])
        sock = _raw(link.address, KEY)
        f32 = wire.CODES[torch.float32]
        sock.sendall(_frame(0, 1, 0, 77, 2, b"\0" * 8))  # unknown dtype
        sock.sendall(_frame(0, 1, 0, f32, 3, b"\0" * 8))  # length does not match numel
        sock.sendall(_frame(0, 1, 5, f32, 2, b"\0" * 8))  # no such phase
        sock.sendall(_frame(0, 1, 0, f32, 5, b"\1" * 20))  # the posted key, but 5 elements instead of 10
        sock.sendall(b"XXXX" + b"\0" * (wire.HEADER.size - 4))  # not a frame: the connection is closed
        big = _raw(link.address, KEY)
        big.sendall(_frame(0, 1, 0, f32, 2**60, b"", nbytes=2**62))  # far above max_frame_bytes
        stranger = socket.create_connection(link.address, timeout=5.0)
        try:
            wire.dial(stranger, b"w" * 32, 1, 0, "stranger")
        except RuntimeCommError as exc:
            result["stranger"] = str(exc)
        deadline = time.monotonic() + 5
        while (sum(link.dropped.values()) < 6 or link.rejected < 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        result["closed_by_link"] = sock.recv(1) == b"" and big.recv(1) == b""
        result["untouched"] = buffer.tolist() == [-1.0] * 14
        result["dropped"], result["rejected"] = dict(link.dropped), link.rejected
        dist.barrier()  # rank 1 sends k1 .. k4 now
        got.wait()
        result["delivered"] = buffer.tolist() == [-1.0] * 2 + [1.0] * 10 + [-1.0] * 2
        time.sleep(0.5)  # k2 buffered (800 bytes), k3 waits: the cap is 1000 bytes
        result["buffered_bytes"] = link._early_bytes
        outs = [torch.zeros(200) for _ in range(3)]
        for key, out in zip((k2, k3, k4), outs, strict=True):
            link.recv(1, key, out).wait()
        result["after_cap"] = [out[0].item() for out in outs]
    else:
        dist.barrier()
        sends = [link.send(0, k1, torch.ones(10))]
        sends += [link.send(0, k, torch.full((200,), float(k.task))) for k in (k2, k3, k4)]
        for s in sends:
            s.wait()
    dist.barrier()
    link.close()
    return result


def _landing_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 sends four frames before rank 0 posts any receive; rank 0's ``landing`` points three of them."""
    link = TcpLink(None, TIMEOUT_S, TransportOptions(key=KEY), unposted_cap_bytes=1000)
    k1, k2, k3, k4 = (TransferKey(0, t, 0) for t in range(1, 5))
    result: dict[str, Any] = {}
    if rank == 0:
        inbox, elsewhere = torch.zeros(100), torch.zeros(100)
        places = {1: inbox, 2: torch.zeros(99), 3: elsewhere}  # task 2: the wrong size, not taken; task 4: none
        link.landing = lambda peer, key, dtype, numel: places.get(key.task)
        dist.barrier()  # rank 1 sends now
        deadline = time.monotonic() + 5
        while sum(link.early_frames.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        result["landed_before_posting"] = inbox.tolist() == [1.0] * 100
        result["early"], result["buffered_bytes"] = dict(link.early_frames), link._early_bytes
        outs = {2: torch.zeros(100), 3: torch.zeros(100), 4: torch.zeros(100)}
        link.recv(1, k1, inbox).wait()  # where it landed: nothing to copy
        for key in (k2, k3, k4):
            link.recv(1, key, outs[key.task]).wait()  # k3 into another tensor than it landed in: copied
        result["received"] = [inbox[0].item()] + [outs[t][0].item() for t in (2, 3, 4)]
        result["buffered_after"] = link._early_bytes
    else:
        dist.barrier()
        for s in [link.send(0, k, torch.full((100,), float(k.task))) for k in (k1, k2, k3, k4)]:
            s.wait()
    dist.barrier()
    link.close()
    return result


def _fault_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 first never starts its part (hung), then dies while rank 0 pushes."""
    hung = PsTransport(None, 2.0, TransportOptions())
    dying = PsTransport(None, TIMEOUT_S, TransportOptions())
    dist.barrier()
    if rank == 1:
        time.sleep(3.0)
        os._exit(1)

    h = hung.start(_task(0, "push", 1000), TaskBuffer(torch.ones(1000)))
    out = {"hung": _outcome(lambda: h.wait())}
    big = torch.ones(2**22)
    d = dying.start(_task(0, "push", big.numel()), TaskBuffer(big))
    out["dead"] = _outcome(lambda: d.wait())
    out["close"] = _outcome(dying.close)
    return out


# ---------------------------------------------------------------------- tests


@pytest.mark.parametrize("world", [2, 3])
def test_push_then_pull_leaves_the_rank_order_sum_on_every_rank(world: int) -> None:
    results = _spawn(_sums_scenario, world)
    for rank, r in results.items():
        assert r["wrong"] == [], f"rank {rank}: wrong sums at (step, task) {r['wrong']}"
        assert r["all_reduce"] and r["shard"] and r["gathered"], r
        assert r["dropped"] == {}, r
        assert r["bind"] == "127.0.0.1", r  # the route to MASTER_ADDR, not 0.0.0.0


def test_the_link_listens_only_on_the_address_it_is_given() -> None:
    for r in _spawn(_bind_scenario, 2).values():
        assert (r["address"], r["received"]) == ("127.0.0.2", True)
        # and the link keeps the objects alive at its opening out of the collector's passes unless told not to
        assert r["frozen_without"] == 0 and r["frozen_with"] > 1000 and r["frozen_after"] == 0, r


def test_ranks_with_different_keys_refuse_each_other_at_open_with_a_clear_error() -> None:
    for rank, r in _spawn(_wrong_key_scenario, 2).items():
        assert r["error"] is not None and "authentication failed" in r["error"], (rank, r)
        assert r["elapsed_s"] < 5.0, r


def test_malformed_frames_are_dropped_and_counted_and_the_link_keeps_working() -> None:
    r = _spawn(_malformed_scenario, 2)[0]
    assert r["dropped"] == {
        "unknown dtype": 1,
        "bad length": 1,
        "bad key": 1,
        "size mismatch": 1,
        "bad magic": 1,
        "oversize": 1,
    }, r
    assert r["rejected"] == 1 and "authentication failed" in r["stranger"], r
    assert r["closed_by_link"] and r["untouched"] and r["delivered"], r
    assert r["buffered_bytes"] <= 1000, r  # frames nobody posted yet stay under the cap
    assert r["after_cap"] == [2.0, 3.0, 4.0], r


def test_a_frame_before_its_receive_lands_where_the_links_user_says_else_in_a_buffer() -> None:
    r = _spawn(_landing_scenario, 2)[0]
    assert r["landed_before_posting"], r
    assert r["early"] == {"landed": 2, "buffered": 2}, r  # a tensor of the wrong size is not taken
    assert r["buffered_bytes"] == 800, r  # only the buffered frames count against the cap
    assert r["received"] == [1.0, 2.0, 3.0, 4.0] and r["buffered_after"] == 0, r


def test_a_hung_or_dead_peer_ends_waits_with_runtime_comm_error_in_bounded_time() -> None:
    r = _spawn(_fault_scenario, 2, reporters=(0,))[0]
    hung, dead, close = r["hung"], r["dead"], r["close"]
    assert hung["error"] is not None and "ps push of task 't0'" in hung["error"], hung
    assert "did not complete within" in hung["error"] and 1.5 < hung["elapsed_s"] < 4.0, hung
    assert dead["error"] is not None and "rank 1" in dead["error"] and "not a Runtime" not in dead["error"], dead
    assert dead["elapsed_s"] < TIMEOUT_S, dead
    assert close["elapsed_s"] < TIMEOUT_S + 2.0, close


def test_frame_header_layout_is_stable() -> None:
    # 4 magic + 8 bytes + 3 × 8 key + 1 dtype + 8 numel, network order
    assert wire.HEADER.size == 45
    assert struct.calcsize("!4sQqqqBQ") == wire.HEADER.size


def _send_then_close(rank: int, world: int) -> dict[str, Any]:
    link = TcpLink(None, TIMEOUT_S, TransportOptions(bind="127.0.0.1", key=KEY))
    key = TransferKey(0, 0, 0)
    if rank == 0:
        link.send(1, key, torch.arange(4.0)).wait()
        link.close()
        return {}
    deadline = time.monotonic() + TIMEOUT_S
    while 0 not in link._dead and time.monotonic() < deadline:  # the frame and the close have both arrived
        time.sleep(0.01)
    out = torch.zeros(4)
    try:
        link.recv(0, key, out).wait()
        got: Any = out.tolist()
    except RuntimeCommError as exc:
        got = str(exc)
    link.close()
    return {"saw_close": 0 in link._dead, "got": got}


def test_a_frame_sent_before_the_peer_closed_is_still_received_after_the_close_is_seen() -> None:
    r = _spawn(_send_then_close, 2)[1]
    assert r["saw_close"] and r["got"] == [0.0, 1.0, 2.0, 3.0], r
