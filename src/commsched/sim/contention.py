"""How communication and compute slow each other down on a worker: pure cost functions, times in seconds.

Communication has CPU work (collective threads, the kernel's TCP, the
runtime's own work), ``cpu_per_task_ms + cpu_ms_per_mb · bytes / 2²⁰`` per
task (:class:`~commsched.sim.options.SimOptions`), and both sides pay for it.
Compute is delayed by what the tasks that start while it runs take from it
(:func:`debt_s`: their CPU work, or the device's measured overlap costs). A
collective takes at least its CPU work on its slowest worker
(:func:`cpu_floor_s`), and a device that slows transfers while it computes
bounds it further (:func:`slowed_floor_s`). ``left_s`` below is how much
longer a worker computes from now without a wait
(:meth:`~commsched.sim.timeline.Timeline.compute_left_s`). With every option
at 0 and no measured overlap, overlap is free, as on a GPU whose copies and
kernels run beside compute.
"""

from __future__ import annotations

from collections.abc import Iterable

from commsched.sim.compute import WorkerClass
from commsched.sim.options import SimOptions


def task_cpu_s(options: SimOptions, nbytes: float, transport: str = "") -> float:
    """A task's CPU work on a whole core: ``(cpu_per_task_ms + cpu_ms_per_mb · nbytes / 2²⁰) / 1e3``, with
    ``transport``'s own figures where the options give them (:meth:`~commsched.sim.options.SimOptions.cpu_of`)."""
    per_task_ms, ms_per_mb = options.cpu_of(transport)
    return (per_task_ms + ms_per_mb * nbytes / 2**20) / 1e3


def cpu_s(work_s: float, worker: WorkerClass, options: SimOptions) -> float:
    """How long ``work_s`` of communication's CPU work takes on ``worker``: ``work_s / speed`` with
    ``cpu_scales_with_speed``, else ``work_s``."""
    return work_s / worker.speed if options.cpu_scales_with_speed else work_s


def debt_s(worker: WorkerClass, options: SimOptions, nbytes: float, transport: str = "") -> float:
    """What starting a task of ``nbytes`` moved by ``transport`` takes from ``worker``'s compute: its CPU work,
    or the device's measured overlap costs (per task and per MiB, each where measured)."""
    per_mb, per_task = worker.overlap_ms_per_mb, worker.overlap_ms_per_task
    cpu_per_task_ms, cpu_ms_per_mb = options.cpu_of(transport)
    fixed_s = cpu_s(cpu_per_task_ms / 1e3, worker, options) if per_task is None else per_task / 1e3
    mib = nbytes / 2**20
    bytes_s = cpu_s(cpu_ms_per_mb * mib / 1e3, worker, options) if per_mb is None else per_mb * mib / 1e3
    return fixed_s + bytes_s


def cpu_floor_s(work_s: float, workers: Iterable[tuple[WorkerClass, float]], options: SimOptions) -> float:
    """The least time a task of CPU work ``work_s`` takes: on its slowest worker, sharing the core with compute.

    ``workers``: ``(worker, left_s)`` for each worker class. A worker's core
    runs its compute and the collective's CPU work ``w`` side by side at half
    speed each (processor sharing), so with ``r`` of compute left the work is
    done after ``w + min(w, r)``: ``2w`` while forward or backward outlasts
    it, ``w`` on a worker that waits. In backward ``r`` is what remains of
    it; in forward it is taken as longer than the work; at backward's end
    (what follows is a wait or the step) as nothing.
    """
    floor = 0.0
    for worker, left_s in workers:
        w = cpu_s(work_s, worker, options)
        floor = max(floor, w + min(w, left_s))
    return floor


def slowed_floor_s(uncontended_s: float, workers: Iterable[tuple[WorkerClass, float]]) -> float:
    """The least time a collective takes where a device slows transfers while it computes (``overlap_comm_rate``).

    ``workers``: ``(worker, left_s)`` for each worker class. The
    collective's uncontended time ``n`` (its phases' latency and transfer)
    runs at ``rate`` of its speed while a worker of that rate computes,
    ``left`` more, and at full speed after: ``n / rate`` if it is done
    before, else ``left + n - rate · left``; the slowest worker's figure
    bounds the collective (its peers wait for its share of the ring).
    Taken as the collective starts (a queued one may start after the
    compute it was issued beside has ended).
    """
    n = uncontended_s
    floor = 0.0
    for worker, left in workers:
        rate = worker.overlap_comm_rate
        if rate is None or rate >= 1.0:
            continue
        floor = max(floor, n / rate if n <= rate * left else left + n - rate * left)
    return floor
