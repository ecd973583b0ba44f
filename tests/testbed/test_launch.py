"""run_workers on the loopback testbed: success, a failing rank, a hanging rank (no root needed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from commsched.testbed import LoopbackTestbed, TestbedError, run_workers


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_every_rank_gets_its_rendezvous_environment(tmp_path: Path) -> None:
    code = (
        "import os, pathlib; e = os.environ; "
        "pathlib.Path(e['OUT'], e['RANK'])"
        ".write_text(e['WORLD_SIZE'] + ' ' + e['MASTER_ADDR'] + ' ' + e['MASTER_PORT'])"
    )
    with LoopbackTestbed(3) as bed:
        run_workers(bed, _python(code), log_dir=tmp_path, timeout_s=30, extra_env={"OUT": str(tmp_path)})
    seen = {p.name: p.read_text().split() for p in tmp_path.iterdir() if p.name.isdigit()}
    assert set(seen) == {"0", "1", "2"}
    assert {tuple(v) for v in seen.values()} == {tuple(seen["0"])} and seen["0"][:2] == ["3", "127.0.0.1"]


def test_a_failing_rank_ends_the_launch_naming_it_and_its_last_words(tmp_path: Path) -> None:
    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit('rank one broke')\ntime.sleep(60)"
    start = time.monotonic()
    with LoopbackTestbed(3) as bed, pytest.raises(TestbedError) as info:
        run_workers(bed, _python(code), log_dir=tmp_path, timeout_s=60, fail_grace_s=0.5)
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "rank 1 exited with status 1" in message and "rank one broke" in message
    assert "rank 0 was still running (killed)" in message


def test_a_hanging_launch_is_killed_at_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = f"import os, time, pathlib; pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid())); time.sleep(60)"
    start = time.monotonic()
    with LoopbackTestbed(1) as bed, pytest.raises(TestbedError, match=r"still running after 1\.5 s"):
        run_workers(bed, _python(code), log_dir=tmp_path, timeout_s=1.5)
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
