"""benchmarks/dlcp_trace records a DLCP link's events; benchmarks/dlcp_round_trace.py sets them beside the rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = [ROOT / "benchmarks" / "results" / run for run in ("dlcp-round-trace", "dlcp-round-trace-first-send")]
SCRIPT = ROOT / "benchmarks" / "dlcp_round_trace.py"


def _round_events(i: int, posted: float, sent: float, first: float, last: float, last_bytes: int) -> list[list]:
    return [["x", i + posted - 1e-4, 0], ["p", i + posted, "S", 0, 0], ["s", i + sent, 9000],
            ["r", i + first, 9000], ["r", i + last, last_bytes]]  # fmt: skip


def test_each_senders_medians_count_from_its_own_start_and_the_first_peers(
    script_loader: Callable[[str], ModuleType],
) -> None:
    round_trace = script_loader("benchmarks/dlcp_round_trace.py")
    rounds = 4
    ranks = [
        {"rank": 0, "comm_starts_s": [i for i in range(rounds)], "ends_s": [i + 0.0451 for i in range(rounds)]},
        {"rank": 1, "comm_starts_s": [i + 0.001 for i in range(rounds)], "ends_s": [i + 0.0535 for i in range(rounds)]},
        {"rank": 2, "server": True, "comm_starts_s": [], "ends_s": []},  # a dedicated server: no row
    ]  # fmt: skip
    events = {
        0: [e for i in range(rounds) for e in _round_events(i, 3e-4, 1.1e-3, 3.1e-3, 4.31e-2, 1_500_000)],
        1: [e for i in range(rounds) for e in _round_events(i, 1.2e-3, 1.5e-3, 2.5e-3, 5.25e-2, 2_000_000)],
    }
    got = round_trace.breakdown(ranks, events, warmup=1)
    assert set(got) == {0, 1}
    assert got[0]["rounds"] == 2  # rounds 1 and 2: the warm-up and the last left out
    names = ("posted_ms", "sent_ms", "arrived_ms", "rate_mbit_s", "end_ms", "exchange_ms")
    expected = {0: (0.3, 1.1, 2.1, 300, 2.0, 45.1), 1: (0.2, 0.5, 2.5, 320, 1.0, 52.5)}
    for rank, values in expected.items():
        for name, value in zip(names, values, strict=True):
            assert got[rank][name] == pytest.approx(value, rel=1e-6), (rank, name)
    with pytest.raises(ValueError, match="no trace of rank 1"):
        round_trace.breakdown(ranks, {0: events[0]}, warmup=1)


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_the_tables_in_benchmarks_md_are_the_saved_runs(run: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.strip()
    assert table in (ROOT / "BENCHMARKS.md").read_text()
    assert len(table.splitlines()) == 2 + 2 * 2  # lossless and loss, two senders each


def test_a_folder_that_is_not_a_run_is_refused_naming_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{tmp_path}: no tails.json" in done.stderr
    (tmp_path / "tails.json").write_text(json.dumps({"meta": {"config": {"warmup": 1}}, "scenarios": {}}))
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no trace.*.json" in done.stderr


_TRANSFER = """
import torch
from commsched.transport.dlcp.link import DlcpLink
from commsched.transport.dlcp.sockets import LinkSockets
from commsched.transport.links import TransferKey
sockets = [LinkSockets("127.0.0.1", ()) for _ in range(2)]
links = [DlcpLink(r, 2, sockets[r], [s.endpoints for s in sockets], bytes(range(32))) for r in range(2)]
out = torch.zeros(100_000)
recv = links[1].recv(0, TransferKey(0, 7, 0), out)
links[0].send(1, TransferKey(0, 7, 0), torch.ones(100_000)).wait(10)
recv.wait(10)
assert bool((out == 1).all())
for link in links:
    link.close()
"""


def test_the_hook_records_a_transfers_posts_datagrams_and_ends(
    tmp_path: Path, script_loader: Callable[[str], ModuleType]
) -> None:
    round_trace = script_loader("benchmarks/dlcp_round_trace.py")
    path = os.pathsep.join([str(ROOT / "benchmarks" / "dlcp_trace"), str(ROOT / "src")])
    env = os.environ | {"DLCP_TRACE_DIR": str(tmp_path), "PYTHONPATH": path, "RANK": "3"}
    before = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _TRANSFER], env=env, capture_output=True, text=True, timeout=120)
    after = time.monotonic()
    assert done.returncode == 0, done.stderr[-3000:]
    (trace,) = round_trace.load_traces(tmp_path)
    assert trace["rank"] == 3
    kinds = [e[0] for e in trace["events"]]
    assert kinds.count("p") == 2 and kinds.count("f") == 2  # the receive and the send, each posted and ended
    sent = sum(e[2] for e in trace["events"] if e[0] == "s")
    read = sum(e[2] for e in trace["events"] if e[0] == "r")
    assert sent >= 400_000 and read >= 400_000  # every element went out and came in, headers on top
    assert all(before < e[1] < after for e in trace["events"])  # the machine's monotonic clock, as the rounds'
    # a process without a DLCP link writes nothing
    other = tmp_path / "other"
    done = subprocess.run([sys.executable, "-c", "import torch"], env=env | {"DLCP_TRACE_DIR": str(other)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and not other.exists()
