"""Collectives on real gloo process groups (127.0.0.1), 2 and 4 ranks.

Each world size is spawned once; every scenario runs in those processes and
reports per rank, so each test below only reads its scenario's outcome.  Every
spawn is bounded: a hung collective fails the test instead of hanging it.

Tolerance: the ring adds the ranks' contributions in a different order than
gloo's all-reduce, and float addition is not associative.  For any order of
summing p values the error is at most (p - 1)·eps·Σ|x_i| per element, so two
orders differ by at most twice that (``_sum_bound``).  Integer-valued data
sums exactly in any order and must match bit for bit.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _processes import run_ranks

from commsched.errors import RuntimeCommError
from commsched.transport.collectives import Collectives

pytestmark = pytest.mark.multiproc

SPAWN_TIMEOUT_S = 60.0
GROUP_TIMEOUT_S = 15.0


# ---------------------------------------------------------------------- harness


def _spawn(
    target: Callable[[int, int], dict[str, Any]], world: int, reporters: tuple[int, ...] | None = None
) -> dict[int, dict[str, Any]]:
    return run_ranks(target, world, group_timeout_s=GROUP_TIMEOUT_S, within_s=SPAWN_TIMEOUT_S, reporters=reporters)


# ---------------------------------------------------------------------- scenarios (run inside each rank)


def _sum_bound(x: torch.Tensor, world: int) -> torch.Tensor:
    """Largest gap between two summation orders of x over the ranks, per element."""
    abs_sum = x.abs()
    dist.all_reduce(abs_sum)
    return 2 * (world - 1) * torch.finfo(x.dtype).eps * abs_sum


def _reference(x: torch.Tensor) -> torch.Tensor:
    expected = x.clone()
    dist.all_reduce(expected)
    return expected


def _close(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    gap = (actual - expected).abs()
    assert bool((gap <= bound).all()), f"max gap {gap.max().item():.3e} exceeds bound {bound.max().item():.3e}"


def _gen(rank: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 * seed + rank)


def _check_random_reduce_scatter(c: Collectives, rank: int, world: int) -> None:
    for dtype, seed in ((torch.float32, 1), (torch.float32, 2), (torch.float64, 3)):
        flat = torch.randn(world * 4099, generator=_gen(rank, seed), dtype=dtype)
        before = flat.clone()
        shard = torch.empty(4099, dtype=dtype)
        c.reduce_scatter(flat, shard).wait()
        assert torch.equal(flat, before), "reduce_scatter modified its input"
        _close(shard, _reference(flat).chunk(world)[rank], _sum_bound(flat, world).chunk(world)[rank])


def _check_all_gather_is_exact(c: Collectives, rank: int, world: int) -> None:
    shard = torch.randn(3001, generator=_gen(rank, 4))
    flat = torch.full((world * 3001,), float("nan"))
    c.all_gather(shard, flat).wait()
    shards = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(shards, shard)
    assert torch.equal(flat, torch.cat(shards))


def _check_integer_data_is_bit_exact(c: Collectives, rank: int, world: int) -> None:
    flat = torch.randint(-1000, 1000, (world * 777,), generator=_gen(rank, 5)).float()
    shard = torch.empty(777)
    c.reduce_scatter(flat, shard).wait()
    expected = _reference(flat)
    assert torch.equal(shard, expected.chunk(world)[rank])
    gathered = torch.empty_like(flat)
    c.all_gather(shard, gathered).wait()
    assert torch.equal(gathered, expected)


def _check_uneven_looking_sizes(c: Collectives, rank: int, world: int) -> None:
    for k in (1, 3, 7, 129, 10_007):
        flat = torch.randn(world * k, generator=_gen(rank, k))
        shard = torch.empty(k)
        c.reduce_scatter(flat, shard).wait()
        expected, bound = _reference(flat), _sum_bound(flat, world)
        _close(shard, expected.chunk(world)[rank], bound.chunk(world)[rank])
        out = torch.empty_like(flat)
        c.all_gather(shard, out).wait()
        _close(out, expected, bound)
        c.all_reduce(flat).wait()
        _close(flat, expected, bound)
    # a model's 12345 gradients, padded to the next multiple of world size
    grads = torch.randn(12_345, generator=_gen(rank, 6))
    padded_numel = -(-grads.numel() // world) * world
    flat = torch.zeros(padded_numel)
    flat[: grads.numel()] = grads
    shard = torch.empty(padded_numel // world)
    c.reduce_scatter(flat, shard).wait()
    c.all_gather(shard, flat).wait()
    _close(flat[: grads.numel()], _reference(grads), _sum_bound(grads, world))


def _check_in_flight_waited_in_reverse(c: Collectives, rank: int, world: int) -> None:
    rs_in = [torch.randn(world * n, generator=_gen(rank, 10 + n)) for n in (5000, 17, 2048)]
    rs_out = [torch.empty(t.numel() // world) for t in rs_in]
    ag_in = [torch.randn(n, generator=_gen(rank, 20 + n)) for n in (999, 4096)]
    ag_out = [torch.empty(world * t.numel()) for t in ag_in]
    ar = [torch.randn(n, generator=_gen(rank, 30 + n)) for n in (1234, 8)]
    ar_before = [t.clone() for t in ar]
    handles = []
    for i in range(3):  # interleave the three kinds, issued back to back
        handles.append(c.reduce_scatter(rs_in[i], rs_out[i]))
        if i < 2:
            handles.append(c.all_gather(ag_in[i], ag_out[i]))
            handles.append(c.all_reduce(ar[i]))
    for h in reversed(handles):
        h.wait(timeout_s=GROUP_TIMEOUT_S)
        assert h.is_completed()
    for flat, shard in zip(rs_in, rs_out, strict=True):
        _close(shard, _reference(flat).chunk(world)[rank], _sum_bound(flat, world).chunk(world)[rank])
    for shard, flat in zip(ag_in, ag_out, strict=True):
        shards = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(shards, shard)
        assert torch.equal(flat, torch.cat(shards))
    for after, before in zip(ar, ar_before, strict=True):  # the direct path sums in rank order, gloo's ring not
        _close(after, _reference(before), _sum_bound(before, world))


def _check_mixed_sequence(c: Collectives, rank: int, world: int) -> None:
    order = torch.Generator().manual_seed(7)  # same op sequence on every rank
    issued: list[tuple[str, torch.Tensor, torch.Tensor, Any]] = []
    for i in range(24):
        kind = ("all_reduce", "reduce_scatter", "all_gather")[int(torch.randint(3, (1,), generator=order))]
        n = int(torch.randint(1, 3000, (1,), generator=order))
        data = torch.randn(world * n, generator=_gen(rank, 100 + i))
        if kind == "all_reduce":
            buf = data.clone()
            issued.append((kind, data, buf, c.all_reduce(buf)))
        elif kind == "reduce_scatter":
            buf = torch.empty(n)
            issued.append((kind, data, buf, c.reduce_scatter(data, buf)))
        else:
            shard = data[:n].clone()
            buf = torch.empty(world * n)
            issued.append((kind, shard, buf, c.all_gather(shard, buf)))
    perm = torch.randperm(len(issued), generator=order).tolist()
    for j in perm:
        issued[j][3].wait()
    for kind, src, buf, _ in issued:
        if kind == "all_reduce":
            _close(buf, _reference(src), _sum_bound(src, world))
        elif kind == "reduce_scatter":
            _close(buf, _reference(src).chunk(world)[rank], _sum_bound(src, world).chunk(world)[rank])
        else:
            shards = [torch.empty_like(src) for _ in range(world)]
            dist.all_gather(shards, src)
            assert torch.equal(buf, torch.cat(shards))


def _check_in_place_rs_then_ag_is_all_reduce(c: Collectives, rank: int, world: int) -> None:
    flat = torch.randn(world * 2500, generator=_gen(rank, 8))
    expected, bound = _reference(flat), _sum_bound(flat, world)
    shard = flat.chunk(world)[rank]  # a view: the decoupled all-reduce needs no extra buffer
    c.reduce_scatter(flat, shard).wait()
    c.all_gather(shard, flat).wait()
    _close(flat, expected, bound)


def _check_bad_sizes_raise_value_error(c: Collectives, rank: int, world: int) -> None:
    flat = torch.zeros(world * 3 + 1)
    for issue in (lambda: c.reduce_scatter(flat, torch.zeros(3)), lambda: c.all_gather(torch.zeros(3), flat)):
        with pytest.raises(ValueError) as info:
            issue()
        message = str(info.value)
        assert f"flat has {world * 3 + 1} elements, expected world_size ({world}) × shard.numel() (3)" in message
        assert f"pad flat to a multiple of {world}" in message
    with pytest.raises(ValueError, match="share dtype"):
        c.reduce_scatter(torch.zeros(world * 2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        c.reduce_scatter(torch.zeros(world * 4)[::2], torch.zeros(2))
    # nothing was sent: the ranks still agree on what comes next
    _check_integer_data_is_bit_exact(c, rank, world)


CHECKS: dict[str, Callable[[Collectives, int, int], None]] = {
    "random_reduce_scatter": _check_random_reduce_scatter,
    "all_gather_exact": _check_all_gather_is_exact,
    "integer_bit_exact": _check_integer_data_is_bit_exact,
    "uneven_sizes": _check_uneven_looking_sizes,
    "in_flight_reverse": _check_in_flight_waited_in_reverse,
    "mixed_sequence": _check_mixed_sequence,
    "in_place_rs_ag": _check_in_place_rs_then_ag_is_all_reduce,
    "bad_sizes": _check_bad_sizes_raise_value_error,
}
#: Each mode's ``Collectives`` keywords: the ring with the backend's all-reduces, the backend's own ops
#: only, and the direct connections (between 2 ranks every op; among 4 the small all-reduces, the rest
#: the backend's).
MODES: dict[str, dict[str, bool]] = {
    "ring": {"ring": True, "direct": False},
    "backend": {"ring": False, "direct": False},
    "direct": {"ring": False, "direct": True},
}


def _check_subgroups(rank: int, world: int) -> None:
    """Two halves of the world, each with its own Collectives: a 1-rank group at world 2, 2 ranks at world 4."""
    halves = [list(range(world // 2)), list(range(world // 2, world))]
    groups = [dist.new_group(half) for half in halves]  # every rank creates every group
    mine = groups[rank * 2 // world]
    c = Collectives(mine, timeout_s=GROUP_TIMEOUT_S, ring=True)
    n = c.world_size
    flat = torch.randint(-1000, 1000, (n * 513,), generator=_gen(rank, 9)).float()
    expected = flat.clone()
    dist.all_reduce(expected, group=mine)
    shard = torch.empty(513)
    c.reduce_scatter(flat, shard).wait()
    assert torch.equal(shard, expected.chunk(n)[c.rank])
    gathered = torch.empty_like(flat)
    c.all_gather(shard, gathered).wait()
    assert torch.equal(gathered, expected)
    c.close()


def _check_ring_opened_later(rank: int, world: int) -> None:
    """A ring left closed at construction refuses a reduce-scatter at issue, naming why; opened, it runs."""
    c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, ring=True, direct=False, open_ring=False)
    flat = torch.arange(2.0 * world) + rank
    shard = torch.empty(2)
    with pytest.raises(RuntimeCommError, match="the ring is not open"):
        c.reduce_scatter(flat, shard).wait()
    c.open_ring()
    c.open_ring()  # once only: a second call creates no group
    c.reduce_scatter(flat, shard).wait()
    expected = sum(torch.arange(2.0 * world) + r for r in range(world))
    assert torch.equal(shard, expected.chunk(world)[rank])
    c.close()


def _exactness_scenario(rank: int, world: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    default = Collectives(dist.new_group())
    results["defaults"] = {
        "backend": default.backend,
        "ring": default.ring,
        "direct": default.direct,
        "world_size": default.world_size,
        "rank": default.rank,
    }
    default.close()
    for mode, keywords in MODES.items():
        c = Collectives(dist.new_group(), timeout_s=GROUP_TIMEOUT_S, **keywords)
        for name, check in CHECKS.items():
            try:
                check(c, rank, world)
                results[f"{mode}:{name}"] = None
            except Exception:
                results[f"{mode}:{name}"] = traceback.format_exc()
        c.close()
    for name, check in (("subgroups", _check_subgroups), ("ring opened later", _check_ring_opened_later)):
        try:
            check(rank, world)
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
    # Rank 0 hosts the TCPStore: if it exited while a peer still set up its 1-rank subgroup through
    # the store, the peer got "Connection reset by peer" (seen once at world 2). Leave together.
    dist.barrier()
    return results


def _outcome(fn: Callable[[], None]) -> dict[str, Any]:
    """How long ``fn`` took and the RuntimeCommError it raised (None: none; any other error is named as such)."""
    t0 = time.monotonic()
    try:
        fn()
        error = None
    except RuntimeCommError as exc:
        error = str(exc)
    except Exception as exc:
        error = f"not a RuntimeCommError: {exc!r}"
    return {"elapsed_s": time.monotonic() - t0, "error": error}


def _fault_scenario(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 first hangs (never issues), then issues a large op and exits in the middle of it."""
    hung = Collectives(timeout_s=2.0, ring=True, direct=False)
    dying = Collectives(timeout_s=GROUP_TIMEOUT_S, ring=True, direct=False)
    dist.barrier()
    flat, shard = torch.ones(2**24), torch.empty(2**24 // world)  # 64 MiB: far from done when the peer exits
    if rank == 1:
        time.sleep(4.0)
        dying.reduce_scatter(flat, shard)
        os._exit(1)

    small = torch.ones(world * 1000)
    h = hung.reduce_scatter(small, torch.empty(1000))
    out = {"wait_bounded_by_caller": _outcome(lambda: h.wait(timeout_s=0.5))}
    out["wait_bounded_by_timeout_s"] = _outcome(h.wait)
    out["queued_after_failure"] = _outcome(hung.all_gather(torch.ones(1000), small).wait)
    out["dead_peer_ring"] = _outcome(dying.reduce_scatter(flat, shard).wait)
    out["dead_peer_backend"] = _outcome(dying.all_reduce(torch.ones(1000)).wait)
    return out


# ---------------------------------------------------------------------- tests


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def exactness(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    results = _spawn(_exactness_scenario, world)  # a rank that raised fails here
    return world, [results[r] for r in range(world)]


def _assert_passed(exactness: tuple[int, list[dict[str, Any]]], check: str) -> None:
    world, results = exactness
    for mode in MODES:
        for rank, result in enumerate(results):
            error = result[f"{mode}:{check}"]
            assert error is None, f"{mode}, world {world}, rank {rank}:\n{error}"


def test_ring_and_direct_small_all_reduces_are_the_default_on_gloo(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    world, results = exactness
    for rank, result in enumerate(results):
        assert result["defaults"] == {
            "backend": "gloo",
            "ring": True,
            "direct": True,
            "world_size": world,
            "rank": rank,
        }


def test_reduce_scatter_matches_all_reduce_on_random_data(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "random_reduce_scatter")


def test_all_gather_is_bit_exact(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "all_gather_exact")


def test_integer_valued_data_is_bit_exact(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "integer_bit_exact")


def test_uneven_looking_and_padded_sizes(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "uneven_sizes")


def test_ops_in_flight_waited_in_reverse_order(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "in_flight_reverse")


def test_mixed_op_sequence_waited_out_of_order(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "mixed_sequence")


def test_in_place_reduce_scatter_then_all_gather_equals_all_reduce(
    exactness: tuple[int, list[dict[str, Any]]],
) -> None:
    _assert_passed(exactness, "in_place_rs_ag")


def test_bad_sizes_raise_value_error_naming_the_sizes(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    _assert_passed(exactness, "bad_sizes")


def test_collectives_on_subgroups(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    world, results = exactness
    for rank, result in enumerate(results):
        assert result["subgroups"] is None, f"world {world}, rank {rank}:\n{result['subgroups']}"


def test_a_ring_left_closed_refuses_its_ops_until_opened(exactness: tuple[int, list[dict[str, Any]]]) -> None:
    world, results = exactness
    for rank, result in enumerate(results):
        assert result["ring opened later"] is None, f"world {world}, rank {rank}:\n{result['ring opened later']}"


def test_dead_or_hung_peer_ends_wait_with_runtime_comm_error_in_bounded_time() -> None:
    survivor = _spawn(_fault_scenario, 2, reporters=(0,))[0]

    caller = survivor["wait_bounded_by_caller"]
    assert caller["error"] is not None and "did not complete within 0.5 s" in caller["error"], caller
    assert caller["elapsed_s"] < 2.0, caller

    hung = survivor["wait_bounded_by_timeout_s"]  # the transfer's own 2 s timeout fires
    assert hung["error"] is not None and "reduce_scatter" in hung["error"] and "rank 1" in hung["error"], hung
    assert "timed out" in hung["error"].lower(), hung
    assert hung["elapsed_s"] < 5.0, hung

    queued = survivor["queued_after_failure"]
    assert queued["error"] is not None and "earlier ring op failed" in queued["error"], queued
    assert queued["elapsed_s"] < 1.0, queued

    for key in ("dead_peer_ring", "dead_peer_backend"):
        dead = survivor[key]
        assert dead["error"] is not None and "not a RuntimeCommError" not in dead["error"], dead
        assert dead["elapsed_s"] < 30.0, dead
    assert "rank 1" in survivor["dead_peer_ring"]["error"]
    assert "all_reduce" in survivor["dead_peer_backend"]["error"]
