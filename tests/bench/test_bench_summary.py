"""How bench turns the ranks' raw times into iteration times, ratios and tables (no processes, no root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched.bench.baselines import DDP_GRID, YARDSTICK, best_ddp
from commsched.bench.collect import _collect
from commsched.bench.config import BenchConfig
from commsched.bench.job import Job
from commsched.bench.plot import plot
from commsched.bench.report import grid_markdown, grid_table, markdown_table, session_table
from commsched.bench.summary import _add_ratios, _rank_iteration_ms, resummarise, step_ms
from commsched.bench.worker import runtime_knobs, session_order
from commsched.testbed import LinkShape
from commsched.transport import TransportOptions


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


def test_step_percentiles_pool_the_slowest_rank_of_every_timed_step(tmp_path: Path) -> None:
    dear = _session(tmp_path)["summary"]["dear"]
    # timed steps (warm-up 1): rank 1 is slowest at the first (250 ms), then both take 200
    assert dear["steps"] == 3 and dear["p50_ms"] == pytest.approx(200)
    assert dear["p90_ms"] == pytest.approx(240)  # linear between the 2nd and 3rd of 200, 200, 250
    assert step_ms({"times_s": [[9.0, 0.1, 0.3], [9.0, 0.2, 0.1, 0.5]]}, warmup=1) == pytest.approx([200, 300])


def test_markdown_table_lists_policies_then_references(tmp_path: Path) -> None:
    session = _session(tmp_path)
    report = {
        "meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8, "warmup": 1}}
    }
    lines = markdown_table(report, session).splitlines()
    assert lines[0].startswith("| policy | iter ms |")
    assert lines[2].startswith("| torch_ddp | 300 |") and "reference" in lines[2]
    assert lines[3].startswith("| dear | 217 |") and "1.38×" in lines[3] and "1.0e-07" in lines[3]
    assert lines[4].startswith("| *compute, N in lock-step* | 100 |")
    assert lines[-1].startswith("| *ideal ≈ max(N in lock-step, all-reduce)* | 150 |")


def test_a_session_of_unshaped_links_says_unshaped_not_none(tmp_path: Path) -> None:
    session = _session(tmp_path) | {"label": LinkShape().label}
    report = {
        "meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8, "warmup": 1}}
    }
    assert str(session_table(report, session).title).endswith("links unshaped")
    assert LinkShape().description == "unshaped" and LinkShape(rate_bps=10**9).description == "1gbit"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    session = _session(tmp_path)
    report = {
        "meta": {
            "config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8, "warmup": 1},
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
        ({"mtu_bytes": 100}, "mtu: must be an integer from 576 to 65535 bytes, got 100"),
    ],
)
def test_config_refuses_what_cannot_be_measured(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kw)


def test_config_defaults_measure_every_policy_against_torch_ddp() -> None:
    config = BenchConfig(shapes=(LinkShape(), LinkShape(rate_bps=10**9)))
    assert config.policies[0] == "torch_ddp" and "dear" in config.policies and config.warmup >= 3


# ------------------------------------------------------------------ the DDP grid

#: Iteration ms per repeat. ddp[1MiB] has the fastest single repeat (240) but ddp[4MiB] the lowest median.
GRID_MS = {
    "torch_ddp": (300, 330, 310),
    "ddp[25MiB]": (400, 440, 420),
    "ddp[4MiB]": (250, 300, 260),
    "ddp[1MiB]": (270, 240, 280),
    "ddp[4MiB,find_unused]": (320, 340, 330),
    "ddp[1MiB,find_unused]": (350, 360, 355),
    "dear": (200, 250, 200),
}


def _grid_session(tmp_path: Path) -> dict:
    runs = [
        (name, repeat, [1.0, ms / 1e3, ms / 1e3], {"max_param_diff": 1e-7} if name != "torch_ddp" else {})
        for repeat in range(3)
        for name, per_repeat in GRID_MS.items()
        for ms in [per_repeat[repeat]]
    ]
    for rank in range(2):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_rank_file(rank, runs)))
    session = {"label": "300mbit", "shape": {}} | _collect(tmp_path, world=2, warmup=1, batch=8)
    _add_ratios(session, None)
    return session


GRID_REPORT = {
    "meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8, "warmup": 1}}
}


def test_best_ddp_is_the_lowest_median_of_the_grid_and_speedups_pair_each_repeat(tmp_path: Path) -> None:
    session = _grid_session(tmp_path)
    assert session["default_ddp"] == "ddp[25MiB]"
    assert session["best_ddp"] == "ddp[4MiB]"  # median 260, not ddp[1MiB] whose best repeat is 240
    dear = session["summary"]["dear"]
    # per repeat: 400/200, 440/250, 420/200 and 250/200, 300/250, 260/200
    assert dear["speedup_vs_default_ddp"] == pytest.approx(2.0)
    assert (dear["speedup_vs_default_ddp_min"], dear["speedup_vs_default_ddp_max"]) == pytest.approx((1.76, 2.1))
    assert dear["speedup_vs_best_ddp"] == pytest.approx(1.25)  # the ratio of medians would be 1.3
    assert (dear["speedup_vs_best_ddp_min"], dear["speedup_vs_best_ddp_max"]) == pytest.approx((1.2, 1.3))
    assert dear["speedup_vs_torch_ddp"] == pytest.approx(1.5)  # still there, for the parameter reference
    assert session["summary"]["ddp[4MiB]"]["speedup_vs_best_ddp"] == pytest.approx(1.0)
    assert session["summary"]["ddp[25MiB]"]["speedup_vs_default_ddp"] == pytest.approx(1.0)


def test_best_ddp_needs_the_whole_grid() -> None:
    summary = {name: {"median_ms": ms[0]} for name, ms in GRID_MS.items()}
    assert best_ddp(summary) == "ddp[4MiB]"
    del summary["ddp[1MiB,find_unused]"]
    assert best_ddp(summary) is None


def test_markdown_table_with_the_grid_compares_with_default_and_best_ddp(tmp_path: Path) -> None:
    session = _grid_session(tmp_path)
    lines = markdown_table(GRID_REPORT, session).splitlines()
    assert lines[0] == (
        "| policy | iter ms | min–max | samples/s | vs default DDP | vs best DDP | ÷ ideal | max \\|Δp\\| |"
    )
    assert lines[2].startswith("| torch_ddp | 310 |") and lines[2].endswith("| reference |")
    assert lines[3] == "| dear | 200 | 200–250 | 80.0 | 2.00× (1.76–2.10) | 1.25× (1.20–1.30) | — | 1.0e-07 |"
    tails = markdown_table(GRID_REPORT, session, tails=True).splitlines()  # the console's columns
    assert tails[0].startswith("| policy | iter ms | min–max | p50 / p90 ms | samples/s |")
    assert tails[3] == (
        "| dear | 200 | 200–250 | 200 / 250 | 80.0 | 2.00× (1.76–2.10) | 1.25× (1.20–1.30) | — | 1.0e-07 |"
    )
    assert lines[4].startswith("| default DDP: ddp[25MiB] | 420 | 400–440 |") and "| 1.00× |" in lines[4]
    assert lines[5].startswith("| best DDP: ddp[4MiB] | 260 | 250–300 |")
    assert lines[6].startswith("| *torch DDP, 1 MiB buckets* | 355 |")
    assert len(lines) == 7
    grid = grid_markdown(session).splitlines()
    assert grid[0] == "| DDP | bucket_cap_mb | find_unused_parameters | iter ms | min–max | vs default DDP |"
    assert [row.split(" | ")[0] for row in grid[2:]] == [
        "| ddp[25MiB] (default)",
        "| ddp[4MiB] (best)",
        "| ddp[1MiB]",
        "| torch_ddp",
        "| ddp[4MiB,find_unused]",
        "| ddp[1MiB,find_unused]",
    ]
    # vs default: 400/250, 440/300, 420/260
    assert grid[3] == "| ddp[4MiB] (best) | 4 | False | 260 | 250–300 | 1.60× (1.47–1.62) |"
    assert grid_table(GRID_REPORT, session) is not None
    assert "vs best DDP" in str(session_table(GRID_REPORT, session).columns[6].header)


def test_a_report_saved_before_the_grid_resummarises_without_grid_rows(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session["runs"]["torch_ddp_1mb"] = session["runs"]["torch_ddp"]  # the yardstick's name before the grid
    report = {
        "meta": {"config": {"policies": ["torch_ddp", "dear"], "model": "cnn", "workers": 2, "batch": 8, "warmup": 1}},
        "sessions": [session],
    }
    (session,) = resummarise(report)["sessions"]
    assert "torch_ddp_1mb" not in session["runs"] and YARDSTICK in session["summary"]
    assert "default_ddp" not in session and "best_ddp" not in session
    assert "speedup_vs_best_ddp" not in session["summary"]["dear"]
    lines = markdown_table(report, session).splitlines()
    assert lines[0].startswith("| policy | iter ms | min–max | samples/s | speed-up | ÷ ideal |")
    assert lines[4].startswith("| *torch DDP, 1 MiB buckets* | 300 |")
    assert grid_markdown(session) == "" and grid_table(report, session) is None


def test_plot_with_the_grid_writes_a_png(tmp_path: Path) -> None:
    report = GRID_REPORT | {"sessions": [_grid_session(tmp_path)]}
    report["meta"] = report["meta"] | {"machine": {"cpus": 2}}
    plot(report, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_every_repeat_runs_torch_ddp_first_then_the_policies_and_the_grid_rotated() -> None:
    first = session_order(["torch_ddp", "dear"], 0, references=True, ddp_grid=True)
    assert first == ["torch_ddp", "dear", *(c.name for c in DDP_GRID if c.name != "torch_ddp")]
    second = session_order(["torch_ddp", "dear"], 1, references=True, ddp_grid=True)
    assert second == ["torch_ddp", *first[2:], "dear"]
    assert session_order(["dear"], 0, references=False, ddp_grid=True) == first  # DDP runs whatever --policies says
    default = "ddp[25MiB]"  # default DDP: always measured, grid or not
    assert session_order(["dear"], 0, references=True, ddp_grid=False) == ["torch_ddp", "dear", default, YARDSTICK]
    assert session_order(["dear"], 0, references=False, ddp_grid=False) == ["torch_ddp", "dear", default]


def test_a_commsched_policy_gets_the_links_mtu_when_it_is_not_1500_and_torch_ddp_never() -> None:
    job = Job("session", "/tmp/x", "cnn", 8, 10, 3, 1, knobs={"dlcp": {"loss_bound": 0.02}}, mtu_bytes=9000)
    knobs = runtime_knobs(job, "dlcp", repeat=0)
    assert knobs["transport_options"] == TransportOptions(mtu_bytes=9000) and knobs["loss_bound"] == 0.02
    assert knobs["trace"] is True and knobs["timeout_s"] == job.comm_timeout_s
    assert "transport_options" not in runtime_knobs(Job("session", "/tmp/x", "cnn", 8, 10, 3, 1), "dlcp", 1)
    assert runtime_knobs(job, "torch_ddp", repeat=0) == {}
