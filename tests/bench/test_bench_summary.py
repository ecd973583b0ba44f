"""How bench turns the ranks' raw times into iteration times, ratios and tables (no processes, no root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched.bench.report import markdown_table, plot, session_table
from commsched.bench.run import BenchConfig, _add_ratios, _collect, _rank_iteration_ms
from commsched.testbed import LinkShape


def test_rank_iteration_time_is_the_mean_over_the_timed_window() -> None:
    starts = [0.0, 1.0, 2.0, 2.5, 4.0]
    times = [0.9, 0.9, 0.4, 1.4, 0.5]
    # timed steps 2..4: from 2.0 to 4.5, three steps
    assert _rank_iteration_ms(starts, times, warmup=2) == pytest.approx(2.5 / 3 * 1e3)


def _rank_file(rank: int, runs: list[tuple[str, int, list[float], dict[str, float]]]) -> dict:
    out = []
    for name, repeat, times, extra in runs:
        starts = [sum(times[:i]) for i in range(len(times))]
        out.append({"name": name, "repeat": repeat, "times_s": times, "starts_s": starts, **extra})
    return {"rank": rank, "world": 2, "runs": out, "threads": 1}


def _session(tmp_path: Path) -> dict:
    fast, slow = [1.0, 0.2, 0.2, 0.2], [1.0, 0.3, 0.3, 0.3]
    ranks = [
        [
            ("compute", 0, [1.0, 0.1, 0.1, 0.1], {}),
            ("allreduce", 0, [0.1, 0.15, 0.15, 0.15], {}),
            ("torch_ddp", 0, slow, {"max_param_moved": 0.1, "replica_spread": 0.0}),
            ("dear", 0, fast if rank == 0 else [1.0, 0.25, 0.2, 0.2], {"max_param_diff": 1e-7}),
        ]
        for rank in range(2)
    ]
    for rank, runs in enumerate(ranks):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_rank_file(rank, runs)))
    session = {"label": "1gbit", "shape": {}} | _collect(tmp_path, world=2, warmup=1, batch=8)
    _add_ratios(session, None)
    return session


def test_collect_takes_the_slowest_rank_and_ratios_compare_with_torch_ddp(tmp_path: Path) -> None:
    session = _session(tmp_path)
    dear = session["summary"]["dear"]
    assert dear["median_ms"] == pytest.approx(650 / 3)  # rank 1: 0.25 + 0.2 + 0.2 over 3 steps
    assert dear["samples_per_s"] == pytest.approx(2 * 8 / (0.65 / 3))
    assert dear["speedup_vs_torch_ddp"] == pytest.approx(300 / (650 / 3))
    assert session["ideal_overlap_ms"] == pytest.approx(150)  # max(compute 100, all-reduce 150)
    assert dear["vs_ideal"] == pytest.approx((650 / 3) / 150)
    assert dear["max_param_diff"] == 1e-7


def test_markdown_table_lists_policies_then_references(tmp_path: Path) -> None:
    session = _session(tmp_path)
    report = {"meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8}}}
    lines = markdown_table(report, session).splitlines()
    assert lines[0].startswith("| policy | iter ms |")
    assert lines[2].startswith("| torch_ddp | 300 |") and "reference" in lines[2]
    assert lines[3].startswith("| dear | 217 |") and "1.38×" in lines[3] and "1.0e-07" in lines[3]
    assert lines[4].startswith("| *compute, N in lock-step* | 100 |")
    assert lines[-1].startswith("| *ideal ≈ max(N in lock-step, all-reduce)* | 150 |")


def test_a_session_of_unshaped_links_says_unshaped_not_none(tmp_path: Path) -> None:
    session = _session(tmp_path) | {"label": LinkShape().label}
    report = {"meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8}}}
    assert str(session_table(report, session).title).endswith("links unshaped")
    assert LinkShape().description == "unshaped" and LinkShape(rate_bps=10**9).description == "1gbit"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    session = _session(tmp_path)
    report = {
        "meta": {
            "config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8},
            "machine": {"cpus": 2},
        },
        "sessions": [session],
    }
    plot(report, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"model": "vgg"}, "model"),
        ({"policies": ("torch_ddp", "nope")}, "policies"),
        ({"workers": 1}, "workers"),
        ({"warmup": 2}, "warmup"),
        ({"shapes": ()}, "shapes"),
    ],
)
def test_config_refuses_what_cannot_be_measured(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kw)


def test_config_defaults_measure_every_policy_against_torch_ddp() -> None:
    config = BenchConfig(shapes=(LinkShape(), LinkShape(rate_bps=10**9)))
    assert config.policies[0] == "torch_ddp" and "dear" in config.policies and config.warmup >= 3
