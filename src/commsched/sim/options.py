"""The simulator's settings, :class:`SimOptions`: the cost model's algorithm, concurrency, network and CPU work.

They are not policy knobs (those travel with the plan): they say how the
simulated cluster behaves, and are checked when they are made, so a bad value
fails before a simulation starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from commsched.errors import ScheduleError
from commsched.schedule.base import NetworkEstimate, transport_cpu_entries
from commsched.sim.costs import ALGORITHMS
from commsched.sim.network import NETWORK_MODELS

#: ms per MiB for each second per byte: the simulator's CPU unit against a runtime's.
_MS_PER_MB_PER_S_PER_BYTE = 2**20 * 1e3


def measured_cpu(network: NetworkEstimate) -> dict[str, Any]:
    """The CPU costs a runtime measured (``network``'s, in seconds) as the simulator's keyword arguments
    (milliseconds): ``cpu_per_task_ms``, ``cpu_ms_per_mb`` and ``transport_cpu``, for :class:`SimOptions` (and
    :func:`commsched.plan.gloo.gloo_options`). The inverse of :meth:`SimOptions.planned_with`."""
    apart = tuple(
        (name, task_s * 1e3, byte_s * _MS_PER_MB_PER_S_PER_BYTE) for name, task_s, byte_s in network.transport_cpu
    )
    return {
        "cpu_per_task_ms": network.cpu_per_message_s * 1e3,
        "cpu_ms_per_mb": network.cpu_s_per_byte * _MS_PER_MB_PER_S_PER_BYTE,
        "transport_cpu": apart,
    }


@dataclass(frozen=True)
class SimOptions:
    """Simulator settings (not policy knobs).

    ``algorithm``: collective algorithm of the cost model, ``ring`` (NCCL's and
    gloo's default), ``tree``, ``hierarchical`` or ``ps`` (see
    :class:`~commsched.sim.costs.CommModel`).
    ``max_concurrent``: collectives in flight at once. Default 1: NCCL runs
    the collectives of one communicator one after another on one stream, and
    PyTorch DDP, Horovod, ByteScheduler and this project's runtime use one
    communicator. Set 2 for gloo (its default number of worker threads per
    process group) or more to model several communicators; in-flight
    collectives then share bandwidth fairly while their startup latencies
    overlap.
    ``update_ms``: optimizer time per iteration on the profiled device
    (scaled by worker speed), spread over layers in proportion to their bytes.
    0 by default because the shipped profiles fold it into backward.
    ``network``: the network model (:data:`~commsched.sim.network.NETWORK_MODELS`):
    ``flow`` (α-β phases, bandwidth shared fairly on each link resource) or
    ``packet`` (queues, transports and packets: :mod:`commsched.sim.packet`).
    ``cpu_per_task_ms``, ``cpu_ms_per_mb``: the CPU work of communication
    (collective threads, the kernel's TCP, the runtime's own work) per task
    and per MiB of the task's buffer, ``cpu = cpu_per_task_ms + cpu_ms_per_mb ·
    bytes / 2²⁰``. A task that starts while its worker computes delays that
    worker's compute by its CPU work (one core does both); work that falls
    while the worker waits costs nothing (the core was idle): a wait absorbs
    the CPU work not yet charged, up to its length. The collective itself
    takes at least its CPU work on its slowest worker, twice that where the
    worker computes meanwhile (:func:`~commsched.sim.contention.cpu_floor_s`): on a core
    that also computes, the transfer can be CPU-bound. 0 by default:
    overlap is free, as on a GPU whose copies and kernels run beside compute.
    ``commsched bench --validate`` fits them from the probe's CPU times.
    ``transport_cpu``: ``(transport, per task ms, ms per MiB)`` entries that
    replace those two for the tasks one transport moves (the ``"ps"``
    transport's push and pull over the runtime's own TCP connections cost
    far less CPU per task than a gloo all-reduce; the probe times them apart:
    :data:`~commsched.profile.network.PS_OP`).
    ``cpu_scales_with_speed``: that CPU work takes ``1 / speed`` as long on
    a worker of relative ``speed`` (where the devices are the CPUs that also
    communicate, as on ``commsched bench --plan``'s testbed of CPU quotas);
    off by default: a slower GPU does not make its host's CPU slower.
    A device whose spec measures its ``overlap_ms_per_mb`` (compute's
    slowdown per MiB all-reduced beside it) is charged that per MiB instead
    of ``cpu_ms_per_mb`` when a task starts while it computes, and one
    whose spec measures ``overlap_ms_per_task`` that per task instead of
    ``cpu_per_task_ms``; the floor keeps the options' CPU work (it is the
    collective's own). A device whose spec measures its
    ``overlap_comm_rate`` slows the collectives it takes part in while it
    computes: they keep that share of their uncontended rate until its
    compute ends (:func:`~commsched.sim.contention.slowed_floor_s`).
    """

    algorithm: str = "ring"
    max_concurrent: int = 1
    update_ms: float = 0.0
    network: str = "flow"
    cpu_per_task_ms: float = 0.0
    cpu_ms_per_mb: float = 0.0
    cpu_scales_with_speed: bool = False
    transport_cpu: tuple[tuple[str, float, float], ...] = ()

    def cpu_of(self, transport: str) -> tuple[float, float]:
        """``(per task ms, ms per MiB)`` of communication's CPU work for a task moved by ``transport``."""
        for name, per_task_ms, ms_per_mb in self.transport_cpu:
            if name == transport:
                return per_task_ms, ms_per_mb
        return self.cpu_per_task_ms, self.cpu_ms_per_mb

    def planned_with(self, network: NetworkEstimate) -> NetworkEstimate:
        """``network`` with the CPU work these options charge (in seconds, as a runtime measures it), so that a
        policy that plans with it (``ps``'s fusion, :func:`commsched.schedule.ps.fuse_bytes`) makes the plan the
        runtime that measured it would. The inverse of :func:`measured_cpu`."""
        return replace(
            network,
            cpu_per_message_s=self.cpu_per_task_ms / 1e3,
            cpu_s_per_byte=self.cpu_ms_per_mb / _MS_PER_MB_PER_S_PER_BYTE,
            transport_cpu=tuple(
                (name, task_ms / 1e3, mb_ms / _MS_PER_MB_PER_S_PER_BYTE) for name, task_ms, mb_ms in self.transport_cpu
            ),
        )

    @property
    def charges_cpu(self) -> bool:
        """Some task has CPU work to charge."""
        general = self.cpu_per_task_ms > 0 or self.cpu_ms_per_mb > 0
        return general or any(per_task > 0 or per_mb > 0 for _, per_task, per_mb in self.transport_cpu)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ScheduleError(f"sim: unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}")
        if isinstance(self.max_concurrent, bool) or not isinstance(self.max_concurrent, int):
            raise ScheduleError(f"sim: max_concurrent must be an integer >= 1, got {self.max_concurrent!r}")
        if self.max_concurrent < 1:
            raise ScheduleError(f"sim: max_concurrent must be >= 1, got {self.max_concurrent}")
        for name in ("update_ms", "cpu_per_task_ms", "cpu_ms_per_mb"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (value >= 0 and math.isfinite(value))
            ):
                raise ScheduleError(f"sim: {name} must be a finite number >= 0, got {value!r}")
        entries = transport_cpu_entries(self.transport_cpu)
        if entries is None:
            raise ScheduleError(
                f"sim: transport_cpu entries must be (transport, per task ms >= 0, ms per MiB >= 0), "
                f"got {self.transport_cpu!r}"
            )
        object.__setattr__(self, "transport_cpu", entries)  # a list from JSON: hashable tuples, as declared
        if not isinstance(self.cpu_scales_with_speed, bool):
            raise ScheduleError(f"sim: cpu_scales_with_speed must be true or false, got {self.cpu_scales_with_speed!r}")
        if self.network not in NETWORK_MODELS:
            known = ", ".join(NETWORK_MODELS)
            what = "packet-level network not available yet" if self.network == "packet" else "unknown network model"
            raise ScheduleError(f"sim: {what} ({self.network!r}); network must be one of: {known}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, options: SimOptions | Mapping[str, Any] | None) -> SimOptions:
        if options is None:
            return cls()
        if isinstance(options, SimOptions):
            return options
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ScheduleError(f"sim: unknown option(s) {', '.join(unknown)}; known: {', '.join(cls.names())}")
        return cls(**options)
