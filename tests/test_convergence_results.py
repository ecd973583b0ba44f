"""BENCHMARKS.md's convergence table is what the saved runs give, and no saved run exceeded a bound."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "convergence" / "digits.json"


@pytest.fixture(scope="module")
def convergence(script_loader: Callable[[str], ModuleType]) -> ModuleType:
    return script_loader("benchmarks/convergence.py")


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    return json.loads(RESULT.read_text())


def test_the_published_table_is_recomputed_from_the_saved_runs(convergence: ModuleType, saved: dict) -> None:
    assert convergence.markdown(convergence.summarize(saved["runs"])) in (ROOT / "BENCHMARKS.md").read_text()


def test_every_configuration_ran_on_every_seed_on_both_ranks(convergence: ModuleType, saved: dict) -> None:
    names = [c.name for c in convergence.CONFIGS]
    seen = {(r["config"]["name"], r["seed"], r["rank"]) for r in saved["runs"]}
    assert seen == {(n, s, r) for n in names for s in saved["meta"]["seeds"] for r in (0, 1)}
    assert all(len(r["curve"]) == saved["meta"]["epochs"] for r in saved["runs"])


def test_no_saved_push_or_pull_lost_more_than_its_bound_and_the_bounds_were_reached(saved: dict) -> None:
    for run in saved["runs"]:
        cfg = run["config"]
        if cfg["policy"] != "dlcp":
            continue
        for phase, bound in (("push", cfg["loss_bound"]), ("pull", cfg["pull_loss_bound"])):
            assert run[phase]["max_lost_fraction"] <= bound, (cfg["name"], phase, run[phase])
        if cfg["inject_loss"] >= 2 * cfg["loss_bound"]:  # injected at twice the bound: pushes gave up near it
            assert run["push"]["max_lost_fraction"] > 0.5 * cfg["loss_bound"] or math.isclose(cfg["loss_bound"], 0)
