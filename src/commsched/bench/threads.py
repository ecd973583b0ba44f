"""The CPU time each thread of this process used, and its time waiting for a core, from ``/proc/self/task`` (Linux).

Where a rank's time goes beside its training thread: the interpreter's name
(``python``, ``python3``) is the training thread, ``cs-*`` and ``dlcp-io-*``
the runtime's own threads (:mod:`commsched._threads`; runs recorded before
they were named count them with the training thread), ``gloo_tcp_loop``
gloo's socket loops, ``pt_gloo_runloop`` its work threads. Read before and
after a stretch of iterations, :func:`per_iteration_ms` gives each thread
name's CPU per iteration. :func:`thread_wait_s` reads each thread's run-queue
delay instead (``schedstat``: time runnable but not running, because other
threads, of this process or another, held the cores): the part of a
thread's wall time that no thread's CPU time shows and that is not blocking.
Resolution of :func:`thread_cpu_s`: one clock tick (10 ms on most kernels) per thread and reading,
so a stretch should last seconds.
"""

from __future__ import annotations

import os
from pathlib import Path


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of every thread of this process, keyed ``name:tid``; {} where
    ``/proc`` has no task list."""
    task_dir = Path("/proc/self/task")
    if not task_dir.is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in task_dir.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[f"{name}:{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def per_iteration_ms(before: dict[str, float], after: dict[str, float], iterations: int) -> dict[str, float]:
    """CPU ms per iteration that each thread name used between two :func:`thread_cpu_s` readings
    (threads summed by name; a thread that ended meanwhile is not counted)."""
    if iterations < 1:
        raise ValueError(f"iterations: must be >= 1, got {iterations}")
    out: dict[str, float] = {}
    for key, seconds in after.items():
        name = key.rsplit(":", 1)[0]
        out[name] = out.get(name, 0.0) + (seconds - before.get(key, 0.0)) * 1e3 / iterations
    return out


def thread_wait_s() -> dict[str, float]:
    """Seconds each thread of this process has waited runnable for a core (``schedstat``'s run delay),
    keyed ``name:tid`` as :func:`thread_cpu_s`; {} where the kernel keeps no scheduler statistics."""
    task_dir = Path("/proc/self/task")
    if not task_dir.is_dir():
        return {}
    out = {}
    for task in task_dir.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "schedstat").read_text().split()
        except OSError:  # the thread ended meanwhile, or no schedstat in this kernel
            continue
        out[f"{name}:{task.name}"] = int(fields[1]) / 1e9
    return out
