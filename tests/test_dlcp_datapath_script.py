"""benchmarks/dlcp_datapath.py runs at a tiny scale, with the default pacer burst and a larger one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_datagram_part_runs_with_a_larger_burst_and_batches_more_per_send_call(tmp_path: Path) -> None:
    out = tmp_path / "datapath.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "dlcp_datapath.py"), "--part", "datagrams", "--launches", "1",
            "--mtu", "1500", "--mib", "1", "--transfers", "1", "--batch", "on", "--burst-kib", "0", "64",
            "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    text = out.read_text()
    assert "burst 64 KiB" in text and "burst 64 KiB" in done.stdout, done.stdout
    rows = json.loads(text)["datagrams"]
    keys = sorted(rows)
    assert len(keys) == 2 and any("64 KiB" in k for k in keys), keys

    def per_call(key: str) -> float:
        sender = rows[key][0][0]  # the first launch's sending rank
        assert sender["sent"] > 0 and sender["send_errors"] == 0, sender
        return float(sender["sent"] / sender["send_calls"])

    default, larger = sorted(keys, key=lambda k: "64 KiB" in k)
    if rows[default][0][0]["offload"] == "GSO+GRO":  # (a kernel without UDP GSO sends one datagram per call)
        assert per_call(larger) > per_call(default)  # the burst is what caps a GSO batch
    else:
        assert per_call(larger) == per_call(default) == 1.0
