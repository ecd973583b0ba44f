"""Removing what testbeds build: cleanups a second signal cannot cut short, and the leftovers of killed runs.

A run that was killed outright (SIGKILL, power loss) leaves namespaces and
links named ``csb-<pid>-...``; :func:`remove_leftovers`, called by every new
testbed, deletes those whose owner pid is dead (or was reused by a younger
process) and says so. :func:`project_objects` lists what is left under a
prefix, to check a cleanup.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from commsched.testbed.base import Log
from commsched.testbed.commands import is_stale, owner_pid, parse_link_names, parse_netns_list
from commsched.testbed.system import _stderr, run_command

NETNS_DIR = Path("/run/netns")


@contextlib.contextmanager
def cleanup_without_signals(old_handlers: dict[int, object], close: Callable[[], None]) -> Iterator[None]:
    """Run a cleanup with SIGINT, SIGTERM and SIGHUP held back (a second Ctrl-C must not cut it short);
    when it ends, give the signals their ``old_handlers`` back and drop ``close`` from ``atexit``."""
    blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
        if on_main:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
        atexit.unregister(close)
    finally:
        if on_main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)


@dataclass(frozen=True)
class Leftover:
    kind: Literal["netns", "link"]
    name: str
    owner_pid: int


def _process_start_s(pid: int) -> float | None:
    """Start time (epoch seconds) of a live process, None if there is none with this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22 counts from 1, after "pid (comm)"
    return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")


def find_leftovers() -> list[Leftover]:
    """Project namespaces and root-namespace links whose creating process is gone."""
    found = []
    for name in parse_netns_list(run_command(["ip", "netns", "list"], check=False)):
        pid = owner_pid(name)
        if pid is None:
            continue
        try:
            created: float | None = (NETNS_DIR / name).stat().st_mtime
        except OSError:
            created = None
        if is_stale(created, _process_start_s(pid)):
            found.append(Leftover("netns", name, pid))
    for name in parse_link_names(run_command(["ip", "-o", "link", "show"], check=False)):
        pid = owner_pid(name)
        if pid is not None and is_stale(None, _process_start_s(pid)):
            found.append(Leftover("link", name, pid))
    return found


def kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process inside the namespace ``ns``."""
    pids = [int(p) for p in run_command(["ip", "netns", "pids", ns], check=False).split() if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_leftovers(log: Log = _stderr) -> list[Leftover]:
    """Delete what killed runs left behind (processes inside their namespaces first), saying what."""
    found = find_leftovers()
    for item in found:
        if item.kind == "netns":
            kill_namespace_processes(item.name)
            run_command(["ip", "netns", "del", item.name], check=False)
        else:
            run_command(["ip", "link", "del", item.name], check=False)
    if found:
        owners = ", ".join(sorted({str(i.owner_pid) for i in found}))
        names = ", ".join(i.name for i in found)
        log(f"testbed: removed leftovers of killed runs (owner pid {owners} no longer running): {names}")
    return found


def project_objects(prefix: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with ``prefix`` (to check a cleanup)."""
    names = parse_netns_list(run_command(["ip", "netns", "list"], check=False))
    names += parse_link_names(run_command(["ip", "-o", "link", "show"], check=False))
    return [n for n in names if n.startswith(prefix)]
