"""benchmarks/dlcp_link_counters.py for real, at the smallest scale: a short ``dlcp`` bench on the testbed.

Root only (namespaces, tc); skipped otherwise, with the reason.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from commsched.testbed import netns_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
_REASON = netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.multiproc,
    pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}"),
]


def test_the_counters_of_each_ranks_link_are_printed_per_step(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "dlcp_link_counters.py"), "--model", "cnn", "--workers", "2",
            "--mtu", "9000", "--policies", "dlcp", "--iters", "3", "--warmup", "3", "--repeats", "1", "--no-ddp-grid",
            "--no-references", "--no-probe", "--out", str(tmp_path / "bench")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.split()}
    assert "per step: divided by --warmup + --iters = 6" in done.stdout
    for name in ("sent", "received", "control_datagrams_sent"):
        totals, per_step = [int(c.replace(",", "")) for c in rows[name][::2]], [float(c) for c in rows[name][1::2]]
        assert min(totals) > 0, (name, rows[name])
        assert per_step == pytest.approx([t / 6 for t in totals], abs=0.05), (name, rows[name])
    written, sent = (rows[name][::2] for name in ("written", "sent"))
    assert 0 < int(written[0].replace(",", "")) <= int(sent[1].replace(",", "")), rows  # what the peer sent, at most
    rates = dict(re.findall(r"^  rank (\d) -> \d: .*?, (\d+) rounds; rate", done.stdout, re.MULTILINE))
    assert sorted(rates) == ["0", "1"] and all(int(rounds) > 0 for rounds in rates.values()), done.stdout
