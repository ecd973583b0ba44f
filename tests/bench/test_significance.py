"""auto against the best configuration beside it: paired per repeat, with a confidence interval and a test."""

from __future__ import annotations

import numpy as np
import pytest

from commsched.bench.significance import auto_vs_best


def _session(times: dict[str, list[float]]) -> dict:
    runs = {n: [{"repeat": k, "iteration_ms": t} for k, t in enumerate(ts)] for n, ts in times.items()}
    summary = {n: {"median_ms": float(np.median(ts))} for n, ts in times.items()}
    return {"runs": runs, "summary": summary}


def _machine(repeats: int, seed: int = 0) -> np.ndarray:
    """A machine whose speed drifts between repeats by far more than the differences tested."""
    return 500.0 * np.exp(np.random.default_rng(seed).normal(0.0, 0.15, repeats))


def test_auto_a_steady_four_percent_behind_the_best_is_significantly_slower() -> None:
    m = _machine(10)
    noise = np.random.default_rng(1).normal(0.0, 0.01, 10)
    v = auto_vs_best(_session({"auto": list(m * 1.04 * np.exp(noise)), "ddp": list(m), "wfbp": list(m * 1.2)}))
    assert v is not None and v.best == "ddp" and v.repeats == 10
    assert v.significantly_slower and v.p_slower < 0.01
    assert v.ci_low > 1.0 and v.ci_low < 1.04 < v.ci_high


def test_auto_that_ties_the_best_is_not_significantly_slower_though_the_machine_drifts() -> None:
    m = _machine(12, seed=3)
    noise = np.random.default_rng(4).normal(0.0, 0.02, 12)
    v = auto_vs_best(_session({"auto": list(m * np.exp(noise)), "torch_ddp": list(m), "ddp[4MiB]": list(m * 1.1)}))
    assert v is not None and v.best == "torch_ddp"
    assert not v.significantly_slower
    assert v.ci_low < 1.0 < v.ci_high
    assert v.p_wilcoxon is not None and v.p_wilcoxon > 0.05


def test_only_lossless_policies_and_pytorch_ddp_compete_and_too_few_repeats_decide_nothing() -> None:
    m = _machine(5)
    # dlcp is faster but lossy: auto never chooses it, so it is not the yardstick
    v = auto_vs_best(_session({"auto": list(m), "dlcp": list(m * 0.5), "dear": list(m * 1.01)}))
    assert v is not None and v.best == "dear"
    assert auto_vs_best(_session({"auto": [1.0, 2.0], "ddp": [1.0, 2.0]})) is None
    assert auto_vs_best(_session({"ddp": [1.0, 2.0, 3.0]})) is None


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_identical_ratios_every_repeat_give_a_definite_answer(factor: float) -> None:
    m = _machine(4)
    v = auto_vs_best(_session({"auto": list(m * factor), "ddp": list(m)}))
    assert v is not None and v.ratio == pytest.approx(factor)
    assert v.significantly_slower is (factor > 1.0)
