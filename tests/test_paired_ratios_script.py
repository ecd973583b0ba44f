"""benchmarks/paired_ratios.py: paired ratios against a reference, their geometric mean and its interval."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest


def session(times: dict[str, list[float]]) -> dict:
    return {
        "label": "none",
        "runs": {name: [{"repeat": k, "iteration_ms": ms} for k, ms in enumerate(t)] for name, t in times.items()},
    }


def test_a_configuration_twice_as_fast_every_repeat_reads_two(script_loader: Callable[[str], ModuleType]) -> None:
    rows = script_loader("benchmarks/paired_ratios.py").rows(
        session({"torch_ddp": [200.0, 300.0, 250.0], "fast": [100.0, 150.0, 125.0]}), "torch_ddp"
    )
    assert rows[-1] == "| fast | 125 (100–150) | 2.000 | 2.000 (2.000–2.000) |"


def test_the_ratios_are_paired_by_repeat_and_the_interval_holds_the_mean(
    script_loader: Callable[[str], ModuleType],
) -> None:
    # the repeats' times spread 4x, their paired ratios only from 0.91 to 1
    ref, other = [100.0, 200.0, 300.0, 400.0], [110.0, 220.0, 330.0, 400.0]
    (row,) = script_loader("benchmarks/paired_ratios.py").rows(
        session({"torch_ddp": ref, "other": other}), "torch_ddp"
    )[1:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    ratios = [r / o for r, o in zip(ref, other, strict=True)]
    assert float(cells[2]) == pytest.approx(sorted(ratios)[1] / 2 + sorted(ratios)[2] / 2, abs=5e-4)
    mean, ci = cells[3].split(" (")
    low, high = (float(x) for x in ci.rstrip(")").split("–"))
    geometric = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert float(mean) == pytest.approx(geometric, abs=5e-4)
    assert low < geometric < high


def test_a_missing_reference_or_too_few_repeats_is_refused(script_loader: Callable[[str], ModuleType]) -> None:
    rows = script_loader("benchmarks/paired_ratios.py").rows
    with pytest.raises(ValueError, match="no 'torch_ddp' runs"):
        rows(session({"ddp": [1.0, 2.0, 3.0]}), "torch_ddp")
    with pytest.raises(ValueError, match="2 repeats paired"):
        rows(session({"torch_ddp": [1.0, 2.0], "ddp": [1.0, 2.0]}), "torch_ddp")
