"""Per-worker CPU cgroups and link shapes: paths, writes and commands, without root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from commsched.testbed import LinkShape, cgroups
from commsched.testbed.cgroups import CpuShare, Hierarchy, find_hierarchy, join_argv, parse_cpus, settings
from commsched.testbed.commands import Layout, shaping_commands, worker_shaping_commands

V1_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_COMBINED = """\
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
V1 = Hierarchy(1, Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpuset"))
V2 = Hierarchy(2, Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup"))


def test_the_hierarchy_is_v1_where_both_controllers_are_mounted_else_v2_with_them() -> None:
    assert find_hierarchy(V1_MOUNTS, "") == V1  # a hybrid machine's v2 hierarchy has no controllers
    combined = Hierarchy(1, Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/cpuset"))
    assert find_hierarchy(V1_COMBINED) == combined
    assert find_hierarchy(V2_MOUNTS, "cpuset cpu io memory pids\n") == V2
    assert V2.bases == [Path("/sys/fs/cgroup")] and len(V1.bases) == 2
    assert find_hierarchy(V2_MOUNTS, "io memory pids\n") is None
    assert find_hierarchy("proc /proc proc rw 0 0\n") is None


def test_v1_writes_cores_and_memory_nodes_first_then_period_quota_and_weight() -> None:
    writes = settings(V1, "csb-1-cg0-w1", CpuShare(cpus=(1,), quota=0.25), "0-1", "0")
    base = "/sys/fs/cgroup"
    assert [(str(p), v) for p, v in writes] == [
        (f"{base}/cpuset/csb-1-cg0-w1/cpuset.cpus", "1"),
        (f"{base}/cpuset/csb-1-cg0-w1/cpuset.mems", "0"),
        (f"{base}/cpu/csb-1-cg0-w1/cpu.cfs_period_us", "10000"),
        (f"{base}/cpu/csb-1-cg0-w1/cpu.cfs_quota_us", "2500"),
        (f"{base}/cpu/csb-1-cg0-w1/cpu.shares", "262144"),
    ]
    unlimited = dict(settings(V1, "n", CpuShare(), "0-3", "0", priority=False))
    assert unlimited[V1.cpuset / "n" / "cpuset.cpus"] == "0-3" and unlimited[V1.cpu / "n" / "cpu.cfs_quota_us"] == "-1"
    assert V1.cpu / "n" / "cpu.shares" not in unlimited


def test_v2_writes_cpu_max_and_cpuset() -> None:
    writes = dict(settings(V2, "n", CpuShare(cpus=(0, 2), quota=1.5), "0-3", ""))
    assert writes == {
        V2.cpu / "n" / "cpu.max": "15000 10000",
        V2.cpu / "n" / "cpuset.cpus": "0,2",
        V2.cpu / "n" / "cpu.weight": "10000",
    }
    assert dict(settings(V2, "n", CpuShare(), "0-3", "", priority=False)) == {V2.cpu / "n" / "cpu.max": "max 10000"}


def test_a_worker_joins_every_hierarchy_before_exec(tmp_path: Path) -> None:
    argv = join_argv(V1, "csb-1-cg0-w0", ["python", "-c", "print('a b')"])
    assert argv[:2] == ["sh", "-c"] and argv[-3:] == ["python", "-c", "print('a b')"]
    assert "echo $$ > /sys/fs/cgroup/cpu/csb-1-cg0-w0/cgroup.procs" in argv[2]
    assert "echo $$ > /sys/fs/cgroup/cpuset/csb-1-cg0-w0/cgroup.procs" in argv[2]
    # the shell really writes its own pid, then becomes the command with its arguments intact
    h = Hierarchy(1, tmp_path / "cpu", tmp_path / "cpu set")
    for base in h.bases:
        (base / "w").mkdir(parents=True)
    out = subprocess.run(join_argv(h, "w", ["sh", "-c", 'echo "$$ $1"', "x", "a b"]), capture_output=True, text=True)
    pid, arg = out.stdout.split(" ", 1)
    joined = [(base / "w" / "cgroup.procs").read_text().strip() for base in h.bases]
    assert joined == [pid, pid]
    assert arg.strip() == "a b"


def test_cpu_lists_and_shares_are_checked() -> None:
    assert parse_cpus("0-2,5\n") == {0, 1, 2, 5} and parse_cpus("") == set()
    assert CpuShare(cpus=(1, 0), quota=0.25).label == "cores 0,1 @ 25%" and CpuShare().label == "any core"
    with pytest.raises(ValueError, match=r"quota: must be at least 0.1 .*got 0.05"):
        CpuShare(quota=0.05)
    with pytest.raises(ValueError, match=r"cpus: must be core numbers >= 0 .*got \(-1,\)"):
        CpuShare(cpus=(-1,))


def test_leftovers_are_cgroups_whose_owner_is_dead_and_are_removed_with_a_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    h = Hierarchy(1, tmp_path / "cpu", tmp_path / "cpuset")
    for base in h.bases:
        for name in ("csb-111-cg0-w0", "csb-222-cg0-w0", "other"):
            (base / name).mkdir(parents=True)
            os.utime(base / name, (1000.0, 1000.0))
    monkeypatch.setattr(cgroups, "_process_start_s", lambda pid: {222: 900.0}.get(pid))
    messages: list[str] = []
    removed = cgroups.remove_cgroup_leftovers(messages.append, h)
    assert sorted(p.name for p in removed) == ["csb-111-cg0-w0"] * 2
    assert sorted(p.name for base in h.bases for p in base.iterdir()) == ["csb-222-cg0-w0"] * 2 + ["other"] * 2
    assert len(messages) == 1 and "csb-111-cg0-w0" in messages[0]


def test_per_worker_link_shapes_shape_only_that_workers_link_both_ways() -> None:
    layout = Layout("csb-42-0-", 3)
    fast, slow = LinkShape(rate_bps=10**9), LinkShape(rate_bps=10**8)
    tbf = ["tbf", "rate", "100000000bit", "burst", "67050", "latency", "50ms"]
    assert worker_shaping_commands(layout, 1, slow) == [
        ["tc", "-n", "csb-42-0-w1", "qdisc", "add", "dev", "w1", "root", *tbf],
        ["tc", "-n", "csb-42-0-br", "qdisc", "add", "dev", "b1", "root", *tbf],
    ]
    assert worker_shaping_commands(layout, 2, LinkShape()) == []
    assert shaping_commands(layout, fast) == [c for r in range(3) for c in worker_shaping_commands(layout, r, fast)]
