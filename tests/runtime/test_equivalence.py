"""Every lossless policy trains exactly like PyTorch DDP (gloo, CPU, 2 and 4 ranks).

The model (``_models.TrickyNet``) has tied weights, a branch unused in some
iterations, a forward order different from registration order, a module
called twice and BatchNorm; training uses two param groups or AdamW/RMSprop,
an LR scheduler, and an evaluation forward every third step.

Tolerance: the policies reduce the same float32 numbers in a different
association order (buckets, partitions, ring reduce-scatter), so results may
differ by a few float32 ulps per step; over 6 steps with parameters of order
1 that stays far below 1e-5, while a real scheduling bug (a stale, missing or
doubled update) moves parameters by ~1e-3 or more (see the ``wrong_lr`` check:
a 1 % learning-rate change is caught).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import _workers as W
from conftest import spawn

pytestmark = pytest.mark.multiproc
TOL = 1e-5


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    world = request.param
    optimizers = ["sgd", "adamw"] if world == 2 else ["rmsprop"]
    out = tmp_path_factory.mktemp(f"eq{world}")
    res = spawn(W.equivalence, world, Path(out), optimizers, 6)
    for r in res:
        assert "error" not in r, r.get("error")
        assert "missing" not in r, r
    return res


@pytest.mark.parametrize("policy", W.LOSSLESS)
def test_policy_matches_torch_ddp_parameters_and_optimizer_state(results: list[dict], policy: str) -> None:
    keys = [k for k in results[0] if k.startswith(f"{policy}/")]
    assert keys
    for rank, res in enumerate(results):
        for key in keys:
            assert res[key]["moved"] > 1e-3, f"rank {rank} {key}: training did not change the parameters"
            assert res[key]["params"] < TOL, f"rank {rank} {key}: parameters differ by {res[key]['params']}"
            assert res[key]["state"] < TOL, f"rank {rank} {key}: optimizer state differs by {res[key]['state']}"


def test_harness_detects_a_one_percent_learning_rate_change(results: list[dict]) -> None:
    for res in results:
        assert res["wrong_lr"]["params"] > 100 * TOL
