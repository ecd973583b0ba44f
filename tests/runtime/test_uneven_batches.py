"""Uneven per-rank batches train exactly as one process on the global batch (gloo, CPU, float64).

Rank ``r`` takes ``b_r`` samples of every global batch (``SplitBatchSampler``)
and computes a mean loss over them; the runtime weights its gradient by
``b_r / B`` and sums. In float64 the only difference from one process on the
concatenated batch is summation order (~1e-16 after 3 steps, far below 1e-10); an
unweighted average of the same batches (the control) is off by ~1e-2.
"""

from __future__ import annotations

from pathlib import Path

import _uneven_workers as U
import pytest

from conftest import spawn

pytestmark = pytest.mark.multiproc
TOL = 1e-10
STEPS = 3
POLICIES = {2: ["torch_ddp", "ddp", "dear", "bytescheduler", "horovod", "prophet"], 3: ["ddp", "dear", "bytescheduler"]}
SIZES = {2: [1, 2], 3: [1, 2, 3]}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict]]:
    world = request.param
    out = tmp_path_factory.mktemp(f"uneven{world}")
    res = spawn(U.uneven, world, Path(out), SIZES[world], STEPS, POLICIES[world])
    for r in res:
        assert "error" not in r, r.get("error")
        assert "missing" not in r, r
    return world, res


def test_every_policy_equals_one_process_on_the_global_batch(results: tuple[int, list[dict]]) -> None:
    world, res = results
    for rank, r in enumerate(res):
        assert r["moved"] > 1e-3 and r["clip_effect"] > 1e-4, "the test must move and clip to prove anything"
        keys = [k for k in r if k.count("/") == 2]
        assert len(keys) == len(POLICIES[world]) * 4
        for key in keys:
            assert r[key] < TOL, f"rank {rank} {key}: parameters differ from one process by {r[key]}"


def test_a_plan_file_carrying_the_batches_trains_the_same(results: tuple[int, list[dict]]) -> None:
    world, res = results
    for r in res:
        assert r["plan_file/dear"] < TOL
        assert r["plan_conflict"].startswith(f"batch_sizes: the plan has {SIZES[world]}, parallelize(batch_sizes=...)")


def test_bucket_views_zeroed_in_place_are_weighted_once(results: tuple[int, list[dict]]) -> None:
    for r in results[1]:
        assert r["keep_grads/ddp"] < TOL


def test_model_batch_size_is_the_ranks_share(results: tuple[int, list[dict]]) -> None:
    world, res = results
    for rank, r in enumerate(res):
        assert set(r["batch_size"]) == {SIZES[world][rank]}
        assert r["batch_size_even"] == [None]  # no per-rank batches: the loop's own choice


def test_averaging_uneven_batches_is_not_the_one_process_result(results: tuple[int, list[dict]]) -> None:
    for r in results[1]:
        assert r["unweighted/ddp"] > 1e5 * TOL


def test_bad_batch_sizes_are_refused_at_parallelize_naming_the_entry(results: tuple[int, list[dict]]) -> None:
    world, res = results
    for r in res:
        errors = r["errors"]
        assert errors["length"].startswith("SpecError: invalid parallelize argument:")
        assert f"batch_sizes: expected one entry per rank ({world}), got {world + 1}" in errors["length"]
        assert "batch_sizes[1]: must be a whole number >= 1, got 0" in errors["value"]
        assert "batch_sizes[0]: must be a whole number >= 1, got 1.5" in errors["torch_ddp"]


def test_no_sync_accumulation_with_uneven_batches_equals_one_process(tmp_path: Path) -> None:
    res = spawn(U.uneven_no_sync, 2, tmp_path, [2, 4], STEPS)
    for r in res:
        assert "error" not in r, r.get("error")
        for policy in ("torch_ddp", "ddp", "dear"):
            assert r[f"no_sync/{policy}"] < TOL, (policy, r[f"no_sync/{policy}"])
