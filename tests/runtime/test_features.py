"""Checkpoint/restore, gradient clipping, gradient accumulation, unsupported optimizers, crashed peers."""

from __future__ import annotations

from pathlib import Path

import pytest

import _workers as W
from conftest import spawn

pytestmark = pytest.mark.multiproc
TOL = 1e-5  # same reasoning as test_equivalence


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    res = spawn(W.features, 2, Path(tmp_path_factory.mktemp("features")))
    for r in res:
        assert "error" not in r, r.get("error")
        assert "missing" not in r, r
    return res


def test_checkpoint_restore_continue_equals_uninterrupted_training(results: list[dict]) -> None:
    for res in results:
        assert res["checkpoint"] < TOL


@pytest.mark.parametrize("policy", W.here("ddp", "dear", "bytescheduler", "ps"))
def test_max_grad_norm_equals_clip_grad_norm_on_ddp_gradients(results: list[dict], policy: str) -> None:
    for res in results:
        assert res["clip/effect"] > 100 * TOL, "clipping must change the result, or the test proves nothing"
        assert res[f"clip/{policy}"] < TOL


@pytest.mark.parametrize("policy", ["ddp", "dear", "prophet"])
def test_no_sync_gradient_accumulation_matches_ddp(results: list[dict], policy: str) -> None:
    for res in results:
        assert res[f"accumulate/{policy}"] < TOL


def test_measured_trace_uses_the_simulator_schema_and_plan_task_names(results: list[dict]) -> None:
    for res in results:
        trace = res["trace"]
        assert {"forward", "backward", "reduce_scatter", "all_gather"} <= set(trace["kinds"])
        assert trace["comm_names_in_plan"] and trace["ordered"]
        assert {"emb", "body", "bn", "head"} <= set(trace["layers"])


def test_grad_scaler_works_with_step_policies_and_is_refused_clearly_by_deferred_ones(results: list[dict]) -> None:
    for res in results:
        assert res["scaler/ddp"] == "ok" and res["scaler/ddp_diff"] < TOL
        assert res["scaler/dear"].startswith("GradScaler: dear applies updates after step()")


@pytest.mark.parametrize("policy", W.here("dear", "bytescheduler", "ps"))
def test_bf16_autocast_training_matches_ddp_under_the_same_autocast(results: list[dict], policy: str) -> None:
    for res in results:
        assert res[f"bf16/{policy}"] < TOL


def test_lbfgs_is_refused_with_a_clear_error(results: list[dict]) -> None:
    for res in results:
        assert "LBFGS" in res["lbfgs"] and "per layer" in res["lbfgs"]


@pytest.mark.parametrize("policy", W.here("dear", "bytescheduler", "ps"))
def test_killed_rank_ends_the_others_with_a_clear_error_in_bounded_time(tmp_path: Path, policy: str) -> None:
    res = spawn(W.crash, 3, tmp_path, policy, timeout_s=120)
    assert "missing" in res[1]  # the killed rank wrote nothing
    for rank in (0, 2):
        assert "missing" not in res[rank], f"rank {rank} hung"
        assert res[rank]["outcome"].startswith("RuntimeCommError"), res[rank]["outcome"]
        assert res[rank]["seconds"] < 90
