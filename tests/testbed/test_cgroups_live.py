"""Real cgroups: a worker at 25 % of a core runs a CPU loop about 4x slower than one with a whole core,
per-worker links get their own rates, and nothing is left behind (normal exit, SIGTERM, SIGKILL).

Needs root and the cpu and cpuset controllers (cgroup v1 or v2); skipped otherwise, with the reason.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _signals import ended_within

from commsched.testbed import (
    CpuShare,
    HeteroTestbed,
    LinkShape,
    LoopbackTestbed,
    NetnsTestbed,
    cgroup_objects,
    cgroups_unavailable_reason,
    netns_unavailable_reason,
    project_objects,
    remove_cgroup_leftovers,
    run_workers,
)

_REASON = cgroups_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}")]

_LOOP = textwrap.dedent(
    """
    import time
    t, c, x = time.perf_counter(), time.process_time(), 0
    for i in range({n}):
        x += i
    print("loop_s", time.perf_counter() - t, "cpu_s", time.process_time() - c)
    """
)


def _iterations_for(seconds: float) -> int:
    start, x = time.perf_counter(), 0
    for i in range(1_000_000):
        x += i
    return int(1_000_000 * seconds / (time.perf_counter() - start))


def test_a_worker_at_a_quarter_of_a_core_runs_about_four_times_slower(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores: one per worker")
    cores = sorted(os.sched_getaffinity(0))[:2]
    shares = [CpuShare(cpus=(cores[0],)), CpuShare(cpus=(cores[1],), quota=0.25)]
    n = _iterations_for(0.4)  # at most ~2 s at 25 %
    with HeteroTestbed(LoopbackTestbed(2), cpu=shares) as bed:
        prefix = bed.cgroups.prefix if bed.cgroups else ""
        assert len(cgroup_objects(prefix)) in (2, 4)  # v2: one directory per worker, v1: two
        assert "w1 core" in bed.describe() and "@ 25%" in bed.describe()
        run_workers(bed, [sys.executable, "-c", _LOOP.format(n=n)], log_dir=tmp_path, timeout_s=30)
    assert cgroup_objects(prefix) == []
    times = [re.findall(r"loop_s (\S+) cpu_s (\S+)", (tmp_path / f"launch.rank{r}.log").read_text())[0] for r in (0, 1)]
    (loop_s, cpu_s) = zip(*((float(w), float(c)) for w, c in times), strict=True)
    said = f"full core {loop_s[0]:.2f} s ({cpu_s[0]:.2f} s CPU), quarter core {loop_s[1]:.2f} s ({cpu_s[1]:.2f} s CPU)"
    # the quota itself: the throttled worker got about a quarter of the wall time as CPU, whatever the host's speed
    # (a ratio of the two loops' wall times also moves with the host: 7.1 was seen once on a slow spell)
    assert 0.15 < cpu_s[1] / loop_s[1] < 0.4, said
    assert loop_s[1] / loop_s[0] > 2.5, said


@pytest.mark.skipif(netns_unavailable_reason() is not None, reason=f"testbed: {netns_unavailable_reason()}")
def test_each_worker_link_gets_its_own_rate_and_everything_is_removed() -> None:
    links = [LinkShape(rate_bps=10**9), LinkShape(rate_bps=10**8)]
    with HeteroTestbed(NetnsTestbed(2), cpu=[CpuShare(), CpuShare(quota=0.5)], links=links) as bed:
        assert isinstance(bed.inner, NetnsTestbed)
        prefix, cg_prefix = bed.inner.prefix, bed.cgroups.prefix if bed.cgroups else ""
        qdiscs = bed.inner.qdiscs().splitlines()
        assert "rate 1Gbit" in qdiscs[0] and "rate 1Gbit" in qdiscs[1], qdiscs
        assert "rate 100Mbit" in qdiscs[2] and "rate 100Mbit" in qdiscs[3], qdiscs
        assert "w0 1gbit, w1 100mbit" in bed.describe()
    assert project_objects(prefix) == [] and cgroup_objects(cg_prefix) == []


_HOLDER = textwrap.dedent(
    """
    import signal, time
    from commsched.testbed import CpuShare, HeteroTestbed, LoopbackTestbed
    # Ctrl-C as in a terminal, whatever this process inherited (a background start ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with HeteroTestbed(LoopbackTestbed(2), cpu=[CpuShare(quota=0.5), CpuShare(quota=0.5)]) as bed:
        print(bed.cgroups.prefix, flush=True)
        time.sleep(120)
    """
)


def _start_holder() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    assert prefix.startswith("csb-") and cgroup_objects(prefix), prefix
    return proc, prefix


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_removes_its_cgroups(sig: signal.Signals) -> None:
    proc, prefix = _start_holder()
    proc.send_signal(sig)
    ended_within(proc, 30)
    assert cgroup_objects(prefix) == []


def test_cgroups_of_a_killed_run_are_removed_by_the_next_with_a_message() -> None:
    proc, prefix = _start_holder()
    proc.kill()
    proc.wait(timeout=30)
    assert cgroup_objects(prefix)  # SIGKILL cannot be handled
    messages: list[str] = []
    removed = remove_cgroup_leftovers(messages.append)
    assert {p.name for p in removed} >= {f"{prefix}w0", f"{prefix}w1"}
    assert cgroup_objects(prefix) == []
    assert messages and prefix in messages[0]
