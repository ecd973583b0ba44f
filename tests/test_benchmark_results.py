"""BENCHMARKS.md's tables are what the saved raw results give today, verbatim.

Each file in ``benchmarks/results/`` is a ``commsched bench`` report with
every iteration of every rank and each session's raw calibration. The tables
in BENCHMARKS.md are printed from them by ``benchmarks/testbed_tables.py``;
this test recomputes them (summaries from the raw times, predictions with
today's simulator and α-β fit) and checks they are in the document, so a
change of definitions, of the simulator or of the fit cannot leave the
published numbers behind.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from commsched.bench.calibrate import revalidate
from commsched.bench.report import grid_markdown, markdown_table, phase_table, validation_markdown
from commsched.bench.summary import resummarise

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
DOCUMENT = (ROOT / "BENCHMARKS.md").read_text()


def test_there_are_saved_results() -> None:
    assert len(RESULTS) >= 2


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_the_published_tables_are_recomputed_from_the_raw_results(path: Path) -> None:
    report = revalidate(resummarise(json.loads(path.read_text())))
    assert report["meta"]["complete"]
    for session in report["sessions"]:
        assert markdown_table(report, session) in DOCUMENT, f"{path.name}: {session['label']} table"
        assert phase_table(report, session) in DOCUMENT, f"{path.name}: {session['label']} phases"
        assert "calibration" in session, f"{path.name}: {session['label']} has no raw calibration"
    assert validation_markdown(report) in DOCUMENT, f"{path.name}: validation table"


def test_the_before_and_after_table_of_the_runtime_rewrite_is_recomputed_from_its_runs(
    script_loader: Callable[[str], ModuleType],
) -> None:
    compare_runs = script_loader("benchmarks/compare_runs.py")
    runs = ROOT / "benchmarks" / "results" / "refactor-check"
    before, after = sorted(runs.glob("old-*.json")), sorted(runs.glob("new-*.json"))
    assert len(before) == len(after) == 2
    assert compare_runs.table(before, after) in DOCUMENT


def test_the_auto_tables_are_recomputed_from_their_run() -> None:
    report = resummarise(json.loads((ROOT / "benchmarks" / "results" / "auto-2w" / "bench.json").read_text()))
    for session in report["sessions"]:
        assert markdown_table(report, session) in DOCUMENT, session["label"]


@pytest.mark.parametrize(
    "run", ["auto-unshaped-10", "auto-unshaped-10-cost", "auto-unshaped-10-trials", "auto-unshaped-10-views"]
)
def test_the_ten_repeat_unshaped_auto_tables_and_verdict_are_recomputed_from_their_run(
    script_loader: Callable[[str], ModuleType],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    run: str,
) -> None:
    path = ROOT / "benchmarks" / "results" / run / "bench.json"
    report = resummarise(json.loads(path.read_text()))
    (session,) = report["sessions"]
    assert markdown_table(report, session) in DOCUMENT and phase_table(report, session) in DOCUMENT
    monkeypatch.setattr(sys, "argv", ["auto_vs_best.py", str(path)])
    script_loader("benchmarks/auto_vs_best.py").main()
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| resnet5m")]
    assert row in DOCUMENT and "**slower**" in row


def test_the_300mbit_auto_tables_and_verdict_are_recomputed_from_their_run(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / "benchmarks" / "results" / "auto-300mbit-5" / "bench.json"
    report = resummarise(json.loads(path.read_text()))
    (session,) = report["sessions"]
    assert markdown_table(report, session) in DOCUMENT and phase_table(report, session) in DOCUMENT
    assert grid_markdown(session) in DOCUMENT
    monkeypatch.setattr(sys, "argv", ["auto_vs_best.py", str(path)])
    script_loader("benchmarks/auto_vs_best.py").main()
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| resnet5m")]
    assert row in DOCUMENT and "| 300mbit | ddp[1MiB] | 5 |" in row and "**slower**" in row


def test_the_auto_trial_tables_are_recomputed_from_their_run() -> None:
    report = resummarise(json.loads((ROOT / "benchmarks" / "results" / "auto-2w-trials" / "bench.json").read_text()))
    for session in report["sessions"]:
        assert markdown_table(report, session) in DOCUMENT, session["label"]


@pytest.mark.parametrize("session", ["", *(f"session{n}" for n in range(2, 43))])
def test_the_heterogeneous_testbed_tables_in_the_planning_docs_are_the_saved_runs(session: str) -> None:
    from commsched.bench.hetero_report import markdown

    saved = ROOT / "benchmarks" / "results" / "hetero-resnet5m" / session
    report = json.loads((saved / "hetero.json").read_text())
    table = markdown(report)
    assert table.strip() == (saved / "hetero.md").read_text().strip()
    assert table.strip() in (ROOT / "docs" / "planning.md").read_text()


@pytest.mark.parametrize(
    "run",
    [
        "dlcp-tails-2s-mtu9000",
        "dlcp-tails-2s-mtu9000-ackrepeat",
        "dlcp-tails-2s-mtu9000-rto",
        "dlcp-tails-2s-mtu9000-probe",
        "dlcp-tails-2s-mtu9000-cpu",
        "dlcp-tails-2s-mtu9000-ack",
        "dlcp-tails-2s-mtu9000-tol",
        "dlcp-tails-2s-mtu9000-fastday",
        "dlcp-tails-2s-mtu9000-fastday-compiled",
        "dlcp-tails-2s-mtu9000-own-slice",
        "dlcp-tails-2s-mtu9000-lb3",
        "dlcp-tails-partitions/1mib",
        "dlcp-tails-partitions/4mib",
        *(f"dlcp-tails-burst/{run}" for run in ("new-1", "new-2", "one-1", "one-2")),
        *(f"dlcp-loss-cut-ab/{run}" for run in ("halve-1", "halve-2", "proportional-1", "proportional-2")),
        *(f"dlcp-probe-hold-ab/hold{ms}-{run}" for ms in (10, 2) for run in ("1", "2", "incast")),
        *(f"dlcp-sends-behind-ab/{run}" for run in ("old-1", "new-1", "old-2", "new-2")),
        *(f"dlcp-reports-ab/{run}" for run in ("old-1", "new-1", "old-2", "new-2")),
        *(f"dlcp-push-first-ab/{run}{n}-{i}" for n in (3, 4, 5) for i in (1, 2) for run in ("old", "new")),
        *(f"dlcp-host-queue-ab/{run}" for run in ("old-1", "new-1", "old-2", "new-2")),
        *(f"dlcp-detach-ab/{run}" for run in ("queue-1", "detach-1", "queue-2", "detach-2")),
        *(f"dlcp-post-ab/{run}" for run in ("base-1", "dev-1", "base-2", "dev-2")),
        *(f"dlcp-post-ab-ps/{run}" for run in ("base", "dev")),
        *(f"dlcp-floors/{run}" for run in ("collective", "ps", "ps-025mib")),
        *(f"dlcp-tails-1000/{run}" for run in ("collective", "ps", "collective-freeze")),
        *(f"dlcp-gc-ab/{run}" for run in ("base-1", "new-1", "base-2", "new-2")),
        *(f"dlcp-first-send-ab/{run}" for run in ("base-1", "dev-1", "base-2", "dev-2")),
        "dlcp-fastday-20261202/ps-tails",
        "dlcp-tails-20261203",
    ],
)
def test_the_dlcp_tails_figures_are_recomputed_from_every_saved_round(run: str) -> None:
    from commsched.bench.tails import round_times, summarise, wire_floor_ms
    from commsched.bench.tails_report import ratio_lines
    from commsched.testbed.commands import shaper_burst_bytes

    directory = ROOT / "benchmarks" / "results" / run
    report = json.loads((directory / "tails.json").read_text())
    warmup = report["meta"]["config"]["warmup"]
    for scenario, result in report["scenarios"].items():
        for method, measured in result["methods"].items():
            ranks = [json.loads(p.read_text()) for p in sorted((directory / scenario / method).glob("rank*.json"))]
            times = round_times(ranks, warmup)
            assert times["round_ms"] == pytest.approx(measured["round_ms"])
            assert summarise(times["round_ms"]) == pytest.approx(measured["round"])
            assert measured["round"]["rounds"] == report["meta"]["config"]["rounds"]
            if "floor_ms" in measured:  # runs since the harness gave each method its floor
                config, parts = report["meta"]["config"], [4 * n for n in report["meta"]["partitions_numel"]]
                wire = wire_floor_ms(method, config["senders"], parts, config["rate_bps"], config["loss_bound"],
                                     shaper_burst_bytes(config["rate_bps"]))  # fmt: skip
                assert measured["floor_ms"] == pytest.approx(report["meta"]["compute_ms"] + wire)
    printed = (directory / "output.txt").read_text()
    for line in ratio_lines(report["scenarios"]):
        if "what the loss costs" in line and "what the loss costs" not in printed:
            continue  # runs before the harness printed the loss's cost to the baselines
        assert line in printed and line in DOCUMENT, line


@pytest.mark.parametrize(
    "runs",
    [
        ("dlcp-train-lossless", "dlcp-train-loss1"),
        ("dlcp-train-lossless-rto", "dlcp-train-loss1-rto"),
        ("dlcp-train-lossless-cpu", "dlcp-train-loss1-cpu"),
        ("dlcp-train-lossless-ack", "dlcp-train-loss1-ack"),
        ("dlcp-train-lossless-tol", "dlcp-train-loss1-tol"),
        ("dlcp-train-lossless-refused", "dlcp-train-loss1-refused"),
        ("dlcp-train-lossless-refused-2", "dlcp-train-loss1-refused"),
    ],
)
def test_the_dlcp_training_figures_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], runs: tuple[str, str]
) -> None:
    paths = [ROOT / "benchmarks" / "results" / run / "bench.json" for run in runs]
    reports = [resummarise(json.loads(path.read_text())) for path in paths]
    script_loader("benchmarks/dlcp_training.py").main([str(path) for path in paths])
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if line.startswith("300mbit")]
    assert len(lines) >= 10  # ps, dlcp and default DDP of each run, and the ratios
    for line in lines:
        assert line in DOCUMENT, line
    for report in reports:
        (session,) = report["sessions"]
        assert "ps" in session["summary"] and "dlcp" in session["summary"]
        assert session["summary"]["dlcp"]["steps"] >= 200


@pytest.mark.parametrize(
    ("folder", "count"),
    [
        ("dlcp-cpu-ab", 10),
        ("dlcp-fuse-ab", 8),
        ("dlcp-burst-ab", 4),
        ("dlcp-switch-ab", 4),
        ("dlcp-compiled-ab", 4),
        ("dlcp-mac-ab", 4),
        ("dlcp-ack-ab", 10),
        ("dlcp-ack-loss-ab", 2),
        ("dlcp-window-ab", 6),
        ("dlcp-floor-ab", 8),
        ("dlcp-probe-delay-ab", 4),
    ],
)
def test_the_dlcp_a_b_tables_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], folder: str, count: int
) -> None:
    paths = sorted((ROOT / "benchmarks" / "results" / folder).glob("*.json"))
    assert len(paths) == count
    script_loader("benchmarks/dlcp_cpu_ab.py").main([str(p) for p in paths])
    for line in capsys.readouterr().out.splitlines():
        assert line in DOCUMENT, line


FUSED = ("dlcp-fuse-ab/fuse64*.json", "dlcp-burst-ab/burst4-*.json", "dlcp-switch-ab/*.json", "dlcp-compiled-ab/*.json",
         "dlcp-train-lossless-fuse/bench.json")  # fmt: skip
FEWER_ACKS = ("dlcp-ack-ab/ack-ack-*.json", "dlcp-train-lossless-ack/bench.json")


@pytest.mark.parametrize(
    ("patterns", "count"), [(FUSED, 15), (FEWER_ACKS, 6), ((*FEWER_ACKS, "dlcp-window-ab/win-ack2-*.json"), 9)]
)
def test_the_summaries_over_every_run_of_one_code_are_recomputed(
    script_loader: Callable[[str], ModuleType],
    capsys: pytest.CaptureFixture[str],
    patterns: tuple[str, ...],
    count: int,
) -> None:
    results = ROOT / "benchmarks" / "results"
    paths = [path for pattern in patterns for path in sorted(results.glob(pattern))]
    script_loader("benchmarks/dlcp_cpu_ab.py").main(["--summary", *map(str, paths)])
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith(f"dlcp / ps over {count} reports") and summary in DOCUMENT, summary


def test_the_ps_tables_are_recomputed_from_their_runs(script_loader: Callable[[str], ModuleType]) -> None:
    """BENCHMARKS.md, "The parameter server's tasks ended by its link's threads": the three paired comparisons
    and every row of the wake-ups and waits."""
    compare_runs = script_loader("benchmarks/compare_runs.py")
    thread_cpu = script_loader("benchmarks/thread_cpu.py")
    runs = ROOT / "benchmarks" / "results" / "ps-chained"
    paths = []
    comparisons = (("chained-ab", "old", "new"), ("sender-ab", "new", "newer"), ("unshaped-ab", "old", "new"))
    for ab, before, after in comparisons:
        older, newer = sorted((runs / ab).glob(f"{before}-*.json")), sorted((runs / ab).glob(f"{after}-*.json"))
        assert len(older) == len(newer) == 2, ab
        assert compare_runs.table(older, newer) in DOCUMENT, ab
        paths += [*older, *newer]
    rows = [
        row
        for path in [*paths, runs / "final-1.json"]
        for session in json.loads(path.read_text())["sessions"]
        for row in thread_cpu.totals(path, session, "ps")
    ]
    assert len(rows) == 22
    for row in rows:
        assert row in DOCUMENT, row


def _training_lines(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], runs: list[Path]
) -> list[str]:
    """What ``benchmarks/dlcp_training.py`` prints for ``runs``: per run, ps, dlcp, default DDP and four ratios."""
    script_loader("benchmarks/dlcp_training.py").main([str(path.relative_to(ROOT)) for path in runs])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("300mbit")]
    assert len(lines) == 7 * len(runs)
    return lines


def test_the_direct_sender_and_dlcp_chained_tables_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    """BENCHMARKS.md, "The direct all-reduce's sends through the links' PeerSender" and "DLCP's transfers call
    back": the paired comparison, the DLCP training lines and every row of the wake-ups and waits."""
    compare_runs = script_loader("benchmarks/compare_runs.py")
    thread_cpu = script_loader("benchmarks/thread_cpu.py")
    results = ROOT / "benchmarks" / "results"
    direct = [results / "direct-peersender" / f"{side}-{i}.json" for side in ("old", "new") for i in (1, 2)]
    assert compare_runs.table(direct[:2], direct[2:]) in DOCUMENT
    runs = [f"{side}-{link}" for link in ("lossless", "loss1") for side in ("old", "new")]
    dlcp = [results / "dlcp-chained" / f"{run}.json" for run in runs]
    lines = _training_lines(script_loader, capsys, dlcp)
    rows = [
        row
        for paths, only in ((direct, "ddp"), (dlcp, "dlcp"))
        for path in paths
        for session in json.loads(path.read_text())["sessions"]
        for row in thread_cpu.totals(path, session, only)
    ]
    assert len(rows) == 8
    for line in [*lines, *rows]:
        assert line in DOCUMENT, line


@pytest.mark.parametrize(
    ("folder", "names"),
    [
        # "The first datagram of an exchange from its poster", in training
        ("dlcp-first-send-train", ("base-loss1", "new-loss1", "new-loss1-2", "base-loss1-2")),
        # "Compiled, in training on this host"
        ("dlcp-compiled-train-slowday", ("source-1", "compiled-1", "compiled-2", "source-2")),
    ],
)
def test_the_dlcp_training_ab_lines_and_cpu_rows_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], folder: str, names: tuple[str, ...]
) -> None:
    results = ROOT / "benchmarks" / "results" / folder
    runs = [results / f"{name}.json" for name in names]
    assert sorted(results.glob("*.json")) == sorted(runs)
    lines = _training_lines(script_loader, capsys, runs)
    dlcp_cpu_ab = script_loader("benchmarks/dlcp_cpu_ab.py")
    for line in [*lines, *(dlcp_cpu_ab.row(path) for path in runs)]:
        assert line in DOCUMENT, line


def test_the_dlcp_compiled_table_is_recomputed_from_its_runs(script_loader: Callable[[str], ModuleType]) -> None:
    """BENCHMARKS.md, "DLCP's data path compiled": every row of the alternated runs, from source and compiled,
    lossless and at 1 % loss."""
    dlcp_cpu_ab = script_loader("benchmarks/dlcp_cpu_ab.py")
    paths = sorted((ROOT / "benchmarks" / "results" / "dlcp-compiled").glob("*.json"))
    assert [path.stem for path in paths] == ["compiled-1", "compiled-2", "source-1", "source-2"]
    lossy = sorted((ROOT / "benchmarks" / "results" / "dlcp-compiled" / "loss1").glob("*.json"))
    assert len(lossy) == 4
    for path in [*paths, *lossy]:
        assert dlcp_cpu_ab.row(path) in DOCUMENT, path.stem


def test_the_dlcp_fast_day_tables_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    """BENCHMARKS.md, "DLCP in training on a fast day of the host": the training lines, the CPU rows and the
    waits, from the four saved runs."""
    results = ROOT / "benchmarks" / "results" / "dlcp-fastday"
    runs = [results / f"{name}.json" for name in ("lossless", "lossless-rev", "loss1", "loss1-rev")]
    assert sorted(results.glob("*.json")) == sorted(runs)
    lines = _training_lines(script_loader, capsys, runs)
    dlcp_cpu_ab = script_loader("benchmarks/dlcp_cpu_ab.py")
    thread_cpu = script_loader("benchmarks/thread_cpu.py")
    rows = [dlcp_cpu_ab.row(path) for path in runs] + [
        row
        for path in runs
        for session in json.loads(path.read_text())["sessions"]
        for row in thread_cpu.totals(path, session, "dlcp")
    ]
    assert len(rows) == 8
    for line in [*lines, *rows]:
        assert line in DOCUMENT, line


def test_the_dlcp_sums_in_place_check_is_recomputed_from_its_runs(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    """BENCHMARKS.md, "The parameter server's sums in place and its early frames landed": DLCP's training lines
    and CPU rows before and after, from the two saved runs."""
    results = ROOT / "benchmarks" / "results" / "dlcp-own-slice"
    runs = [results / "before.json", results / "after.json"]
    assert sorted(results.glob("*.json")) == sorted(runs)
    lines = _training_lines(script_loader, capsys, runs)
    rows = [script_loader("benchmarks/dlcp_cpu_ab.py").row(path) for path in runs]
    for line in [*lines, *rows]:
        assert line in DOCUMENT, line


def test_the_dlcp_training_check_after_the_sends_behind_their_phase_is_recomputed_from_its_run(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    """BENCHMARKS.md, "DLCP in training after these changes": the training lines and the CPU row of the run."""
    path = ROOT / "benchmarks" / "results" / "dlcp-sends-behind-train" / "after.json"
    script_loader("benchmarks/dlcp_training.py").main([str(path.relative_to(ROOT))])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("300mbit")]
    assert len(lines) == 7  # ps, dlcp, default DDP and four ratios
    for line in [*lines, script_loader("benchmarks/dlcp_cpu_ab.py").row(path)]:
        assert line in DOCUMENT, line


@pytest.mark.parametrize(
    ("folder", "run"),
    [
        *(("dlcp-push-first-train", run) for run in ("phase-first", "step-first", "loss1")),
        *(("dlcp-host-queue-train", run) for run in ("before", "queue", "lossless", "loss1")),
        *(
            ("dlcp-post-train", run)
            for run in (
                "base-lossless",
                "dev-lossless",
                "base-loss1",
                "dev-loss1",
                "dev-loss1-2",
                "base-loss1-2",
                "base-lossless-2",
                "dev-lossless-2",
            )
        ),
        *(("dlcp-fastday-20261202", run) for run in ("train-loss1-1", "train-loss1-2", "train-lossless")),
        ("dlcp-train-20261203", "train-loss1"),
    ],
)
def test_the_dlcp_training_checks_of_single_runs_are_recomputed_from_them(
    script_loader: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str], folder: str, run: str
) -> None:
    """BENCHMARKS.md, "DLCP in training with pushes first", "In training" under "DLCP keeps its own queue short",
    "DLCP on a fast day of the host" and "DLCP in training at 1 % loss on the next day's host": the training lines
    and the CPU row of each run."""
    path = ROOT / "benchmarks" / "results" / folder / f"{run}.json"
    script_loader("benchmarks/dlcp_training.py").main([str(path.relative_to(ROOT))])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("300mbit")]
    assert len(lines) == 7  # ps, dlcp, default DDP and four ratios
    for line in [*lines, script_loader("benchmarks/dlcp_cpu_ab.py").row(path)]:
        assert line in DOCUMENT, line


@pytest.mark.parametrize(
    ("run", "configurations", "against"),
    [
        *(
            (run, configurations, "torch_ddp")
            for run, configurations in [
                ("unshaped-every-policy-fastday", 10),
                ("unshaped-every-policy-fastday-2", 10),
                ("unshaped-every-policy-fastday-3", 10),
                ("unshaped-every-policy-fusenet", 10),
                ("ps-unshaped-accumulator", 3),
                ("ps-unshaped-own-slice", 3),
                ("ps-unshaped-own-slice-2", 3),
                ("ps-fuse-1024/300mbit-default", 2),
                ("ps-fuse-1024/300mbit-fuse1024", 2),
                ("ps-fuse-1024/unshaped-fuse1024", 2),
                ("ps-fuse-network/unshaped", 2),
                ("ps-tcp-push-first/new-1", 2),
                ("ps-tcp-push-first/old-1", 2),
                ("ps-fuse-network/300mbit", 2),
                ("ps-fuse-network/unshaped-2", 2),
                ("unshaped-ps-ddp-fastday-20261202", 3),
                ("unshaped-ps-ddp-20261203", 3),
                ("unshaped-every-policy-slowday-20261203", 10),
            ]
        ),
        ("unshaped-every-policy-slowday-20261203", 10, "ddp[25MiB]"),
    ],
)
def test_the_unshaped_paired_tables_are_recomputed_from_their_runs(
    run: str, configurations: int, against: str, script_loader: Callable[[str], ModuleType]
) -> None:
    """BENCHMARKS.md, "Every policy unshaped on the fast day", "The parameter server's sums in place", "Every
    policy unshaped after these changes", the two on `ps`'s fusion, "`ps` and `ddp` unshaped on the fast day" and
    its rerun on the next day's host, and "Every policy unshaped on today's code, on the slow host" (also against
    default DDP): every row of the paired ratios of each run against ``against``."""
    paired_ratios = script_loader("benchmarks/paired_ratios.py")
    (session,) = json.loads((ROOT / "benchmarks" / "results" / run / "bench.json").read_text())["sessions"]
    lines = paired_ratios.rows(session, against)
    assert len(lines) == 1 + configurations  # the header and one row per configuration but the reference
    for line in lines:
        assert line in DOCUMENT, line


def test_the_kept_plans_table_is_recomputed_from_every_saved_report(script_loader: Callable[[str], ModuleType]) -> None:
    """BENCHMARKS.md, "`auto` unshaped with the reference measured after a trial of no-overlap": the table of how
    the plans `auto` kept ran, grouped by what its trials measured."""
    kept_plans = script_loader("benchmarks/kept_plans.py")
    lines = kept_plans.table(kept_plans.saved_reports())
    assert len(lines) > 2 and any(line.startswith("| unshaped | DDP's schedule kept |") for line in lines)
    assert "\n".join(lines) in DOCUMENT


@pytest.mark.parametrize(
    ("run", "count"),
    [
        ("dlcp-cpu-split/run", 8),  # two scenarios, two methods, two ranks
        *((f"dlcp-host-queue-writable-ab/{run}", 4) for run in ("base-a", "new-a", "new-b", "base-b")),  # one scenario
    ],
)
def test_the_tails_cpu_tables_are_recomputed_from_their_runs(
    run: str, count: int, script_loader: Callable[[str], ModuleType]
) -> None:
    """BENCHMARKS.md, "Where DLCP's CPU goes against gloo's and TCP's" and "The kernel's wake-up for a full host
    queue": every row of each rank's CPU and counters."""
    rows = script_loader("benchmarks/tails_cpu.py").table(ROOT / "benchmarks" / "results" / run)
    assert len(rows) == count
    for line in rows:
        assert line in DOCUMENT, line


def test_the_ps_split_tensors_table_is_recomputed_from_its_runs(script_loader: Callable[[str], ModuleType]) -> None:
    """BENCHMARKS.md, "The parameter server with its tensors cut as the policies cut them": each row's round
    percentiles, ratio, floor and CPU per round, from the two runs' rounds and ranks."""
    tails_cpu = script_loader("benchmarks/tails_cpu.py")
    folder = ROOT / "benchmarks" / "results" / "dlcp-ps-split-tensors"
    for run, label in (("whole-1mib", "3, whole (1 MiB)"), ("split-025mib", "14, cut (0.25 MiB)")):
        report = json.loads((folder / run / "tails.json").read_text())
        assert len(report["meta"]["partitions_numel"]) == int(label.split(",")[0])
        for scenario, name in (("lossless", "lossless"), ("loss", "1 % loss")):
            methods = report["scenarios"][scenario]["methods"]
            ps, dlcp = methods["ps1"]["round"], methods["dlcp_ps"]["round"]
            cpu = {m: tails_cpu.rank_rows(folder / run / scenario / m) for m in ("ps1", "dlcp_ps")}
            server = " / ".join(f"{r['cpu_ms']:.1f}" for m in ("ps1", "dlcp_ps") for r in cpu[m] if r["server"])
            senders = " / ".join(
                "-".join(f"{v:.1f}" for v in sorted(r["cpu_ms"] for r in cpu[m] if not r["server"]))
                for m in ("ps1", "dlcp_ps")
            )
            row = (
                f"| {label} | {name} | {ps['p50_ms']:.1f} / {ps['p99_ms']:.1f} | {dlcp['p50_ms']:.1f} / "
                f"{dlcp['p99_ms']:.1f} | {ps['p50_ms'] / dlcp['p50_ms']:.2f}x | "
                f"{methods['dlcp_ps']['floor_ms']:.1f} | {server} | {senders} |"
            )
            assert row in DOCUMENT, row


def test_the_overlap_charge_comparison_and_the_readme_figures_are_recomputed_from_every_saved_report(
    script_loader: Callable[[str], ModuleType],
) -> None:
    overlap_charge = script_loader("benchmarks/overlap_charge.py")
    found = overlap_charge.sessions(ROOT / "benchmarks" / "results")
    own = [s for s in found if s.own_connections]
    assert own and len(own) < len(found)
    assert overlap_charge.summary_line("every one that measured the overlap costs", found) in DOCUMENT
    assert overlap_charge.summary_line("the runtime's own all-reduce connections", own) in DOCUMENT
    ranked = [s for s in found if s.ranked is not None]
    assert ranked and all(r.regret >= 1.0 and -1.0 <= r.tau <= 1.0 for s in ranked for r in s.ranked)
    assert overlap_charge.ranking_line("every one that measured the overlap costs", found) in DOCUMENT
    assert overlap_charge.ranking_line("the runtime's own all-reduce connections", own) in DOCUMENT
    _the_readme_quotes_the_validation(found, own)


def _the_readme_quotes_the_validation(found: list[Any], own: list[Any]) -> None:
    """README's simulator sentence: the four-link run's and the out-of-sample runs' median |error| per link, and
    the range of the medians over every session of today's runtime, as re-validated today (charged)."""

    def medians(*reports: str) -> list[str]:
        chosen = {s.label: s for s in found if s.report in reports}
        return [f"{statistics.median(chosen[link].charged):.1f}" for link in ("none", "1gbit", "300mbit", "150mbit")]

    readme = " ".join((ROOT / "README.md").read_text().split())
    a, b, c, d = medians("testbed-resnet5m-2w-4links-20261202")
    assert f"within {a} % unshaped, {b} % at 1 Gbit/s, {c} % at 300 Mbit/s and {d} % at 150 Mbit/s" in readme
    a, b, c, d = medians("testbed-resnet5m-2w-2links-20261203", "testbed-resnet5m-2w-2shaped-20261203")
    assert f"within {a}, {b}, {c} and {d} % on the same four links" in readme
    spread = sorted(statistics.median(s.charged) for s in own)
    assert f"session of today's runtime within {spread[0]:.1f}–{spread[-1]:.1f} %" in readme


def test_the_direct_reduce_scatter_a_b_tables_are_recomputed_from_their_runs(
    script_loader: Callable[[str], ModuleType],
) -> None:
    """BENCHMARKS.md, "Reduce-scatters and all-gathers over the runtime's own connections": each arm's row
    (medians over repeats, ratios paired by repeat) and the before/after table."""
    compare_runs = script_loader("benchmarks/compare_runs.py")
    where = ROOT / "benchmarks" / "results" / "dear-direct-shards-ab"
    arms = ["old-1", "new-2", "new-3", "old-4"]
    for arm in arms:
        report = json.loads((where / f"{arm}.json").read_text())
        (session,) = report["sessions"]
        runs = {name: {r["repeat"]: r["iteration_ms"] for r in reps} for name, reps in session["runs"].items()}
        dear, default, small, alone = (runs[n] for n in ("dear", "ddp[25MiB]", "ddp[1MiB,find_unused]", "allreduce"))
        med = statistics.median
        row = (
            f"| {arm} | {report['meta']['source']['commit'][:7]} | {med(dear.values()):.0f} | "
            f"{min(dear.values()):.0f}–{max(dear.values()):.0f} | {med(default.values()):.0f} | "
            f"{med(small.values()):.0f} | {med(alone.values()):.0f} | {med(default[k] / dear[k] for k in dear):.2f}× | "
            f"{med(small[k] / dear[k] for k in dear):.2f}× | {med(dear.values()) / med(alone.values()):.2f} |"
        )
        assert row in DOCUMENT, row
    old, new = [where / f"{a}.json" for a in arms if a.startswith("old")], [where / f"{a}.json" for a in arms[1:3]]
    assert compare_runs.table(old, new) in DOCUMENT
