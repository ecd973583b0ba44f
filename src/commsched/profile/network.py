"""Network probe: time collectives over a size sweep on a live process group.

>>> alpha_s, beta_s_per_byte, samples = probe_network()     # on every rank of the default group
>>> cluster = measured_cluster(alpha_s, beta_s_per_byte, dist.get_world_size())

(:func:`~commsched.profile.local_probe.probe_local` runs the same probe from one
process, across local gloo processes.)

gloo's ``all_reduce`` is a ring (``gloo::allreduce`` with no algorithm set runs
``ring``), and the runtime's reduce-scatter and all-gather
(:class:`commsched.transport.collectives.Collectives` on CPU tensors) are rings of
point-to-point steps (between 2 ranks the one step of each, over the direct
connections, as the runtime runs them), so every op in :data:`OPS` follows the ring formulas that
:mod:`commsched.profile.probe_fit` fits α and β with. :data:`PS_OP`, asked for
by name, times the runtime's parameter-server transport instead (a push, then
the pull of the sum): its CPU work per task is not gloo's
(:func:`~commsched.profile.probe_fit.fit_cpu` of its samples prices the
``"ps"`` transport's tasks). :data:`GLOO_OP`, asked for by name, times the
backend's own all-reduce (``dist.all_reduce`` on the group), what PyTorch's
``DistributedDataParallel`` runs where the runtime's all-reduces of CPU tensors
go over connections of their own (:mod:`commsched.transport.direct`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

from commsched.cluster import Cluster
from commsched.errors import SpecError
from commsched.profile.probe_fit import GLOO_OP, AlphaBetaFit, CpuFit, ProbeSample, fit_alpha_beta, measured_cluster

if TYPE_CHECKING:
    from commsched.transport.base import TransportOptions

__all__ = [
    "DEFAULT_SIZES_BYTES",
    "GLOO_OP",
    "OPS",
    "PS_OP",
    "NetworkProbe",
    "measure_ops",
    "probe_network",
    "ps_task_cpu",
]

OPS = ("all_reduce", "reduce_scatter", "all_gather")
"""What is timed: gloo's ring all-reduce and the runtime's ring reduce-scatter and all-gather."""

PS_OP = "ps"
"""Also timed when asked for: a push of the buffer, then its pull, through the ``"ps"`` transport (a server on
every rank, over TCP: :class:`~commsched.transport.ps.PsTransport`); two tasks of the runtime."""


def ps_task_cpu(pair: CpuFit) -> CpuFit:
    """One ``"ps"`` task's CPU work from :data:`PS_OP`'s fit of a push and its pull: two tasks, half each."""
    return CpuFit("ps_task", pair.per_op_s / 2, pair.per_byte_s / 2)


#: How long one of :data:`PS_OP`'s transfers may take before the probe fails (a peer that died or hung).
PS_TIMEOUT_S = 120.0

DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(4**k * 1024 for k in range(1, 8))
"""4 KiB, 16 KiB, ..., 16 MiB: from latency-bound to bandwidth-bound on most networks."""


class NetworkProbe(NamedTuple):
    """``(alpha_s, beta_s_per_byte, samples)``: the all-reduce fit, and every sample of every op."""

    alpha_s: float
    beta_s_per_byte: float
    samples: tuple[ProbeSample, ...]

    @property
    def world_size(self) -> int:
        return self.samples[0].world_size

    @property
    def bandwidth_gbps(self) -> float:
        return 8.0 / self.beta_s_per_byte / 1e9

    def fit(self, op: str = "all_reduce") -> AlphaBetaFit:
        """The fit of one op (``all_reduce`` is the one ``alpha_s``/``beta_s_per_byte`` come from)."""
        return fit_alpha_beta(self.samples, op)

    def cluster(self, name: str | None = None) -> Cluster:
        """:func:`measured_cluster` of this probe's all-reduce fit."""
        return measured_cluster(self.alpha_s, self.beta_s_per_byte, self.world_size, name=name)


# ---------------------------------------------------------------- measuring


def probe_network(
    group: dist.ProcessGroup | None = None,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 10,
    *,
    warmup: int = 2,
    ops: Sequence[str] = OPS,
    progress: Callable[[str], None] | None = None,
) -> NetworkProbe:
    """Time ``ops`` over ``sizes_bytes`` on ``group`` (default: the whole world) and fit α-β.

    Collective: call it on every rank of ``group``, with the same arguments.
    Each sample is one op after a barrier, timed with ``time.perf_counter``;
    the slowest rank's time counts (an all-reduce MAX of the times, outside the
    timed region). The ops take turns within each repeat, in a rotating order,
    so load from elsewhere spreads over all of them alike. Buffers are fp32,
    rounded down to a multiple of the world size. ``progress`` gets one line
    per size (on every rank).

    Returns ``(alpha_s, beta_s_per_byte, samples)`` from the all-reduce fit
    (:func:`fit_alpha_beta`); ``NetworkProbe.fit(op)`` fits the others.
    Raises SpecError for bad arguments (world size 1 included) and
    RuntimeCommError if a peer fails.
    """
    if "all_reduce" not in ops:
        raise SpecError("network probe", [f"ops: must include all_reduce (α and β come from it), got {list(ops)}"])
    samples = measure_ops(group, sizes_bytes, repeats, warmup, ops, progress)
    fit = fit_alpha_beta(samples, "all_reduce")
    return NetworkProbe(fit.alpha_s, fit.beta_s_per_byte, samples)


def measure_ops(
    group: dist.ProcessGroup | None,
    sizes_bytes: Sequence[int],
    repeats: int,
    warmup: int,
    ops: Sequence[str],
    progress: Callable[[str], None] | None = None,
    transport_options: TransportOptions | None = None,
) -> tuple[ProbeSample, ...]:
    """The samples of :func:`probe_network` without the fit: ``ops`` (any of :data:`OPS`,
    :data:`PS_OP` and :data:`GLOO_OP`) timed over ``sizes_bytes``, the same way. Collective, as it is.
    ``transport_options``: where :data:`PS_OP`'s transport listens and how it authenticates
    (default: :class:`~commsched.transport.base.TransportOptions`'s)."""
    from commsched.transport.collectives import Collectives

    world = dist.get_world_size(group)
    problems = []
    if world < 2:
        problems.append(f"world size: must be >= 2 to measure a network, got {world}")
    if repeats < 1:
        problems.append(f"repeats: must be >= 1, got {repeats}")
    if warmup < 0:
        problems.append(f"warmup: must be >= 0, got {warmup}")
    bad_ops = [op for op in ops if op not in (*OPS, PS_OP, GLOO_OP)]
    if bad_ops or not ops:
        problems.append(f"ops: must be one or more of {', '.join((*OPS, PS_OP, GLOO_OP))}, got {list(ops)}")
    usable = sorted({(int(s) // 4 // world) * world * 4 for s in sizes_bytes})
    if len([s for s in usable if s > 0]) < 2:
        problems.append(f"sizes_bytes: need two distinct sizes of at least {4 * world} bytes, got {list(sizes_bytes)}")
    if problems:
        raise SpecError("network probe", problems)
    sizes = [s for s in usable if s > 0]
    rank = dist.get_rank(group)
    coll = Collectives(group, ring=True) if set(ops) & set(OPS) else None
    ps = _PsPair(group, transport_options) if PS_OP in ops else None
    samples: list[ProbeSample] = []
    try:
        for size_index, nbytes in enumerate(sizes):
            numel = nbytes // 4
            flat = torch.zeros(numel)  # zeros: repeated sums stay finite
            shard = torch.zeros(numel // world)
            names = [op for op in (*OPS, PS_OP, GLOO_OP) if op in ops]
            times: dict[str, list[float]] = {op: [] for op in names}
            cpu: dict[str, list[float]] = {op: [] for op in names}
            for i in range(warmup + repeats):
                for j in range(len(names)):
                    op = names[(i + j) % len(names)]
                    dist.barrier(group)
                    cpu_start, start = time.process_time(), time.perf_counter()
                    if op == PS_OP:
                        assert ps is not None
                        ps.run(size_index, flat)
                    elif op == GLOO_OP:
                        dist.all_reduce(flat, group=group)
                    else:
                        assert coll is not None
                        _run(coll, op, flat, shard)
                    end = time.perf_counter()
                    spent = torch.tensor([end - start, time.process_time() - cpu_start], dtype=torch.float64)
                    dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=group)
                    if i >= warmup:
                        times[op].append(spent[0].item())
                        cpu[op].append(spent[1].item())
            for op in names:
                samples.append(ProbeSample(op, nbytes, world, tuple(times[op]), tuple(cpu[op])))
            if progress:
                shown = names[0]  # all_reduce where timed: OPS come first
                took = statistics.median(times[shown]) * 1e3
                progress(f"rank {rank}: {nbytes / 1024:,.0f} KiB: {shown} {took:.2f} ms")
    finally:
        if coll is not None:
            coll.close()
        if ps is not None:
            ps.close()
    return tuple(samples)


class _PsPair:
    """:data:`PS_OP`: a push task and its pull through the ``"ps"`` transport, as the runtime launches them."""

    def __init__(self, group: dist.ProcessGroup | None, options: TransportOptions | None) -> None:
        from commsched.transport.base import TransportOptions
        from commsched.transport.ps import PsTransport

        # collective: every rank opens it
        self.transport = PsTransport(group, PS_TIMEOUT_S, options or TransportOptions())

    def run(self, size_index: int, flat: torch.Tensor) -> None:
        from commsched.schedule.base import PS_TRANSPORT, CommTask, Segment
        from commsched.transport.base import TaskBuffer

        segments = (Segment(0, 0, flat.numel()),)
        push_id = 2 * size_index  # one pair of task ids per size: a server's slices are sized by its first push
        push = CommTask(push_id, "push", segments, 4 * flat.numel(), "probe push", transport=PS_TRANSPORT)
        pull = CommTask(push_id + 1, "pull", segments, 4 * flat.numel(), "probe pull", deps=(push_id,),
                        transport=PS_TRANSPORT)  # fmt: skip
        buffer = TaskBuffer(flat)
        self.transport.start(push, buffer).wait()
        self.transport.start(pull, buffer).wait()

    def close(self) -> None:
        self.transport.close()


def _run(coll: Any, op: str, flat: torch.Tensor, shard: torch.Tensor) -> None:
    if op == "all_reduce":
        coll.all_reduce(flat).wait()
    elif op == "reduce_scatter":
        coll.reduce_scatter(flat, shard).wait()
    else:
        coll.all_gather(shard, flat).wait()
