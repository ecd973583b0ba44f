"""Each thread's CPU time and its time waiting for a core, from ``/proc/self/task`` (Linux).

Where a rank's time goes beside its training thread: the interpreter's name
(``python``, ``python3``) is the training thread, ``cs-*`` and ``dlcp-io-*``
the runtime's own threads (:mod:`commsched._threads`; runs recorded before
they were named count them with the training thread), ``gloo_tcp_loop``
gloo's socket loops, ``pt_gloo_runloop`` its work threads. Read before and
after a stretch of iterations, :func:`per_iteration_ms` gives each thread
name's CPU per iteration; resolution: one clock tick (10 ms on most
kernels) per thread and reading, so a stretch should last seconds.
:func:`thread_wait_s` reads each thread's run-queue delay instead
(``schedstat``, in ns: time runnable but not running, because other threads,
of this process or another, held the cores): the part of a thread's wall
time that no thread's CPU time shows and that is not blocking.
:func:`thread_sleeps` counts each thread's voluntary context switches
(``status``): how often it blocked, and so how often something had to wake
it, each wake-up a chance to preempt whatever thread held the core.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def thread_cpu_s(part: str = "both") -> dict[str, float]:
    """CPU seconds of every thread of this process, keyed ``name:tid``: user + system (``part="both"``), or
    only ``"user"`` (the interpreter, libraries) or ``"system"`` (the kernel: sockets, copies, page faults);
    {} where ``/proc`` has no task list."""
    if part not in ("both", "user", "system"):
        raise ValueError(f"part: must be both, user or system, got {part!r}")
    tick = os.sysconf("SC_CLK_TCK")
    fields_read = {"both": (11, 12), "user": (11,), "system": (12,)}[part]

    def cpu(task: Path) -> float:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(fields[i]) for i in fields_read) / tick

    return _per_thread(cpu)


def thread_wait_s() -> dict[str, float]:
    """Seconds each thread of this process has waited runnable for a core (``schedstat``'s run delay),
    keyed ``name:tid`` as :func:`thread_cpu_s`; {} where the kernel keeps no scheduler statistics."""
    return _per_thread(lambda task: int((task / "schedstat").read_text().split()[1]) / 1e9)


def thread_sleeps() -> dict[str, float]:
    """How often each thread of this process has blocked (voluntary context switches, from ``status``),
    keyed ``name:tid`` as :func:`thread_cpu_s`; {} where ``/proc`` has no task list."""

    def sleeps(task: Path) -> float:
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                return float(line.split()[1])
        raise OSError(f"{task}/status: no voluntary_ctxt_switches")

    return _per_thread(sleeps)


def per_iteration_ms(before: dict[str, float], after: dict[str, float], iterations: int) -> dict[str, float]:
    """CPU ms per iteration that each thread name used between two :func:`thread_cpu_s` readings
    (threads summed by name; a thread that ended meanwhile is not counted). The same for
    :func:`thread_wait_s` readings."""
    return per_iteration(before, after, iterations, scale=1e3)


def per_iteration(
    before: dict[str, float], after: dict[str, float], iterations: int, scale: float = 1.0
) -> dict[str, float]:
    """What each thread name gained per iteration between two readings, times ``scale`` (threads summed by
    name; a thread that ended meanwhile is not counted): sleeps per iteration from :func:`thread_sleeps`."""
    if iterations < 1:
        raise ValueError(f"iterations: must be >= 1, got {iterations}")
    out: dict[str, float] = {}
    for key, value in after.items():
        name = key.rsplit(":", 1)[0]
        out[name] = out.get(name, 0.0) + (value - before.get(key, 0.0)) * scale / iterations
    return out


#: What :func:`read_all` reads, by the key a bench report keeps it under, and the scale per iteration.
READINGS: dict[str, tuple[Callable[[], dict[str, float]], float]] = {
    "thread_cpu_ms": (thread_cpu_s, 1e3),
    "thread_wait_ms": (thread_wait_s, 1e3),
    "thread_sleeps": (thread_sleeps, 1.0),
}


def read_all() -> dict[str, dict[str, float]]:
    """Every reading of :data:`READINGS`, by its key."""
    return {key: read() for key, (read, _) in READINGS.items()}


def all_per_iteration(before: dict[str, dict[str, float]], iterations: int) -> dict[str, dict[str, float]]:
    """Each reading's per-iteration figures (:func:`per_iteration`) from ``before`` (a :func:`read_all`) to
    now, by its key; readings the kernel does not keep (empty) left out."""
    after = read_all()
    return {
        key: per_iteration(before[key], after[key], iterations, scale)
        for key, (_, scale) in READINGS.items()
        if before.get(key)
    }


def _per_thread(read: Callable[[Path], float]) -> dict[str, float]:
    """``read(task directory)`` of every thread of this process, keyed ``name:tid`` (threads that ended
    meanwhile, or whose file the kernel lacks, left out)."""
    task_dir = Path("/proc/self/task")
    if not task_dir.is_dir():
        return {}
    out = {}
    for task in task_dir.iterdir():
        try:
            out[f"{(task / 'comm').read_text().strip()}:{task.name}"] = read(task)
        except OSError:
            continue
    return out
