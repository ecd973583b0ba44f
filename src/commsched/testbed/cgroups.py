"""Per-worker CPU speed: a cgroup per worker with a CPU quota and a set of cores.

:class:`CpuCgroups` gives every worker a cgroup of its own, named
``csb-<pid>-cg<n>-w<r>``: a CPU quota (a fraction of one core's time per
period) and a set of cores, e.g. worker 0 alone on core 0 and workers 1 and 2
sharing core 1 at 50 % each. With cgroup v1 (a ``cpu`` and a ``cpuset``
hierarchy) it writes ``cpu.cfs_period_us`` / ``cpu.cfs_quota_us`` and
``cpuset.cpus`` / ``cpuset.mems``; with cgroup v2 (one unified hierarchy with
the ``cpu`` and ``cpuset`` controllers) ``cpu.max`` and ``cpuset.cpus``. Which
one is used is read from ``/proc/mounts``: v1 where both v1 controllers are
mounted (a hybrid machine's v2 hierarchy then has none), else v2.

A worker joins its cgroup before it starts: its command is wrapped in a
``sh`` that writes its own pid into the cgroup's ``cgroup.procs`` and then
``exec``\\ s the command (outside ``ip netns exec``, which hides
``/sys/fs/cgroup``), so the worker and every child it forks run capped.

The cgroups are removed, like :class:`~commsched.testbed.NetnsTestbed`'s
namespaces, on normal exit, on error, on Ctrl-C, SIGTERM and SIGHUP (context
manager, signal handlers, ``atexit``); processes still inside are killed
first. Cgroups of a killed run (SIGKILL) are found by their owner pid and
removed by the next run (:func:`remove_cgroup_leftovers`), which says so.

A testbed runs its workers in them through
:class:`~commsched.testbed.hetero.HeteroTestbed`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shlex
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from commsched.testbed.base import Log
from commsched.testbed.cleanup import _process_start_s, cleanup_without_signals
from commsched.testbed.commands import PREFIX, is_stale, owner_pid
from commsched.testbed.system import TestbedError, _stderr

#: The CFS period every worker's quota is a fraction of (10 ms).
PERIOD_US = 10_000
#: The kernel refuses a quota below 1 ms.
MIN_QUOTA_US = 1_000
#: The largest CPU weight (v1 ``cpu.shares``, v2 ``cpu.weight``): a worker given it gets its quota (or its
#: cores) before any other process of the machine, so its speed does not depend on what else runs there.
PRIORITY_WEIGHT = {1: 262_144, 2: 10_000}
CGROUP_ROOT = Path("/sys/fs/cgroup")
RMDIR_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CpuShare:
    """One worker's CPU: the cores it may run on (None: any) and its time per period as a fraction of one
    core (``quota`` 0.25 = a quarter of a core, 2.0 = two cores' worth; None: unlimited)."""

    cpus: tuple[int, ...] | None = None
    quota: float | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and (not self.cpus or any(not isinstance(c, int) or c < 0 for c in self.cpus)):
            raise ValueError(f"cpus: must be core numbers >= 0 (or None for any), got {self.cpus!r}")
        if self.quota is not None and not self.quota * PERIOD_US >= MIN_QUOTA_US:
            raise ValueError(
                f"quota: must be at least {MIN_QUOTA_US / PERIOD_US:g} (the kernel's 1 ms of a {PERIOD_US} us "
                f"period), got {self.quota!r}"
            )

    @property
    def quota_us(self) -> int | None:
        return None if self.quota is None else round(self.quota * PERIOD_US)

    @property
    def label(self) -> str:
        """``any core``, ``core 0``, ``cores 0,1 @ 25%``."""
        where = "any core" if self.cpus is None else f"core{'s' if len(self.cpus) > 1 else ''} {format_cpus(self.cpus)}"
        return where + ("" if self.quota is None else f" @ {self.quota * 100:g}%")


# ------------------------------------------------------------------ pure builders


@dataclass(frozen=True)
class Hierarchy:
    """Where the cgroups go: ``version`` 1 (``cpu`` and ``cpuset`` directories, maybe the same) or 2 (one)."""

    version: Literal[1, 2]
    cpu: Path
    cpuset: Path

    @property
    def bases(self) -> list[Path]:
        return [self.cpu] if self.cpu == self.cpuset else [self.cpu, self.cpuset]


def format_cpus(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


def parse_cpus(text: str) -> set[int]:
    """A kernel cpu list (``0-3,5``) as a set."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def find_hierarchy(mounts: str, controllers_v2: str | None = None) -> Hierarchy | None:
    """From ``/proc/mounts``: v1 where a ``cpu`` and a ``cpuset`` hierarchy are mounted, else the v2 mount when
    its ``cgroup.controllers`` (``controllers_v2``) lists cpu and cpuset, else None."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup":
            for controller in ("cpu", "cpuset"):
                if controller in options:
                    v1.setdefault(controller, where)
        elif fstype == "cgroup2" and v2 is None:
            v2 = where
    if "cpu" in v1 and "cpuset" in v1:
        return Hierarchy(1, v1["cpu"], v1["cpuset"])
    if v2 is not None and controllers_v2 is not None and {"cpu", "cpuset"} <= set(controllers_v2.split()):
        return Hierarchy(2, v2, v2)
    return None


def cgroup_name(prefix: str, rank: int) -> str:
    return f"{prefix}w{rank}"


def settings(
    h: Hierarchy, name: str, share: CpuShare, parent_cpus: str, parent_mems: str, *, priority: bool = True
) -> list[tuple[Path, str]]:
    """The writes that make cgroup ``name`` (already created) what ``share`` says, in order.

    v1: a cpuset needs ``cpuset.cpus`` and ``cpuset.mems`` before any process may join (the parent's when
    ``share.cpus`` is None); ``cpu.cfs_quota_us`` -1 is unlimited. v2: ``cpu.max`` is ``"QUOTA PERIOD"``.
    ``priority``: the largest CPU weight (:data:`PRIORITY_WEIGHT`).
    """
    cpus = parent_cpus if share.cpus is None else format_cpus(share.cpus)
    quota = share.quota_us
    weight = [(h.cpu / name / ("cpu.shares" if h.version == 1 else "cpu.weight"), str(PRIORITY_WEIGHT[h.version]))]
    if h.version == 1:
        return [
            (h.cpuset / name / "cpuset.cpus", cpus),
            (h.cpuset / name / "cpuset.mems", parent_mems),
            (h.cpu / name / "cpu.cfs_period_us", str(PERIOD_US)),
            (h.cpu / name / "cpu.cfs_quota_us", str(-1 if quota is None else quota)),
        ] + (weight if priority else [])
    out = [(h.cpu / name / "cpu.max", f"{'max' if quota is None else quota} {PERIOD_US}")]
    if share.cpus is not None:
        out.append((h.cpuset / name / "cpuset.cpus", cpus))
    return out + (weight if priority else [])


def join_argv(h: Hierarchy, name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside cgroup ``name``: a shell writes its pid into every ``cgroup.procs``, then execs."""
    joins = " && ".join(f"echo $$ > {shlex.quote(str(base / name / 'cgroup.procs'))}" for base in h.bases)
    return ["sh", "-c", f'{joins} && exec "$@"', "commsched-cgroup", *argv]


# ------------------------------------------------------------------ the system


def host_hierarchy() -> Hierarchy | None:
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return None
    controllers = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            with contextlib.suppress(OSError):
                controllers = (Path(fields[1]) / "cgroup.controllers").read_text()
            break
    return find_hierarchy(mounts, controllers)


def cgroups_unavailable_reason() -> str | None:
    """Why per-worker CPU cgroups cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "per-worker CPU limits need root (to create cgroups); run as root, e.g. with sudo"
    if host_hierarchy() is None:
        return "no cgroup hierarchy with the cpu and cpuset controllers is mounted (v1 or v2)"
    return None


def cgroup_objects(prefix: str, h: Hierarchy | None = None) -> list[Path]:
    """The project's cgroup directories whose name starts with ``prefix`` (to check a cleanup)."""
    h = h or host_hierarchy()
    if h is None:
        return []
    return sorted(p for base in h.bases if base.is_dir() for p in base.iterdir() if p.name.startswith(prefix))


def _empty_and_remove(path: Path, timeout_s: float = RMDIR_TIMEOUT_S) -> bool:
    """Kill what is still inside cgroup ``path``, then remove it; False when it could not be removed."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def remove_cgroup_leftovers(log: Log = _stderr, h: Hierarchy | None = None) -> list[Path]:
    """Remove cgroups of killed runs (owner pid dead, or reused by a younger process), saying which."""
    removed = []
    for path in cgroup_objects(PREFIX, h):
        pid = owner_pid(path.name)
        if pid is None:
            continue
        try:
            created: float | None = path.stat().st_mtime
        except OSError:
            created = None
        if is_stale(created, _process_start_s(pid)) and _empty_and_remove(path):
            removed.append(path)
    if removed:
        log(f"testbed: removed cgroups of killed runs: {', '.join(str(p) for p in removed)}")
    return removed


class CpuCgroups:
    """One cgroup per worker (cores and quota), made now and removed by :meth:`close` (idempotent).

    ``priority`` (default): the workers get the largest CPU weight, so each runs at its share even on a
    machine busy with other work (an uncapped worker then takes its cores from everything else).
    """

    _serial = itertools.count()

    def __init__(self, shares: Sequence[CpuShare], *, priority: bool = True, log: Log = _stderr) -> None:
        reason = cgroups_unavailable_reason()
        if reason is not None:
            raise TestbedError(reason)
        h = host_hierarchy()
        assert h is not None
        self.hierarchy = h
        self.shares = list(shares)
        self.priority = priority
        self.prefix = f"{PREFIX}{os.getpid()}-cg{next(self._serial)}-"
        self.log = log
        self._closed = False
        self._old_handlers: dict[int, object] = {}
        remove_cgroup_leftovers(log, h)
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        h = self.hierarchy
        allowed = (h.cpuset / "cpuset.cpus.effective") if h.version == 2 else (h.cpuset / "cpuset.cpus")
        parent_cpus = allowed.read_text().strip()
        parent_mems = (h.cpuset / "cpuset.mems").read_text().strip() if h.version == 1 else ""
        for r, share in enumerate(self.shares):
            outside = sorted(set(share.cpus or ()) - parse_cpus(parent_cpus))
            if outside:
                raise TestbedError(f"cpu[{r}].cpus: core(s) {format_cpus(outside)} not available here ({parent_cpus})")
        if h.version == 2:
            _write(h.cpu / "cgroup.subtree_control", "+cpu +cpuset")
        for r, share in enumerate(self.shares):
            name = cgroup_name(self.prefix, r)
            for base in h.bases:
                (base / name).mkdir()
            for path, value in settings(h, name, share, parent_cpus, parent_mems, priority=self.priority):
                _write(path, value)

    def wrap(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run in worker ``rank``'s cgroup."""
        return join_argv(self.hierarchy, cgroup_name(self.prefix, rank), argv)

    def describe(self) -> str:
        return ", ".join(f"w{r} {share.label}" for r, share in enumerate(self.shares))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through __exit__ / finally blocks, which clean up

    def close(self) -> None:
        """Kill what is left in the cgroups and remove them. Idempotent, signal-safe."""
        if self._closed:
            return
        self._closed = True
        with cleanup_without_signals(self._old_handlers, self.close):
            for path in cgroup_objects(self.prefix, self.hierarchy):
                _empty_and_remove(path)
            left = cgroup_objects(self.prefix, self.hierarchy)
            if left:
                self.log(f"testbed: could not remove {', '.join(map(str, left))}; the next run will retry")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise TestbedError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None
