"""The transport interface and the registry of transports by name."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from commsched.errors import UnsupportedError
from commsched.schedule.base import COLLECTIVE, PS_TRANSPORT, CommTask
from commsched.schedule.dlcp import DLCP_PS_TRANSPORT, DLCP_TRANSPORT
from commsched.transport.collectives import Collectives
from commsched.transport.handles import Handle


def check_probability(name: str, value: object) -> float:
    """``value`` as a probability in ``[0, 1)``, or ValueError naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value < 1:
        raise ValueError(f"{name}: must be a number in [0, 1), got {value!r}")
    return float(value)


#: The MTUs a datagram transport accepts: IPv4's minimum that every host must take, to the largest IP packet.
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 65535


def check_mtu(name: str, value: object) -> int:
    """``value`` as an MTU in bytes (:data:`MIN_MTU_BYTES` to :data:`MAX_MTU_BYTES`), or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_MTU_BYTES <= value <= MAX_MTU_BYTES:
        raise ValueError(f"{name}: must be an integer from {MIN_MTU_BYTES} to {MAX_MTU_BYTES} bytes, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """Where and how a socket transport listens and authenticates. ``bind`` and ``key`` also serve the
    collective transport's connections for all-reduces of CPU tensors (:mod:`commsched.transport.direct`),
    and the leader's decision channel of ByteScheduler, Prophet, ``ps`` and DLCP
    (:mod:`commsched.runtime.decisions`): every policy on gloo listens on TCP.

    ``bind``: the local address every listening socket binds to (``None``: the
    address this rank's gloo group uses toward its peers; never ``0.0.0.0``
    unless given). ``key``: the per-job key that authenticates every message
    (``None``: rank 0 draws one when the transport opens and shares it over
    the runtime's process group; not secret from anyone who can read that
    group's traffic). ``paths``: local addresses to spread datagrams over (a
    bounded-loss transport sprays packets across them; empty: ``bind`` only).
    ``servers``: the ranks that run the ``"ps"`` transport's servers, each
    owning an even slice of every task (``None``: every rank; ``(0,)``: every
    push reduced on rank 0); a plan that names its servers sets them.
    ``inject_loss``: emulated random loss for experiments — the DLCP link drops
    each outgoing data datagram with this probability before it reaches the
    socket (:mod:`commsched.transport.dlcp.inject`; 0, the default: off);
    ``inject_seed`` seeds it (with the rank). The other transports ignore both.
    ``mtu_bytes``: the path MTU a datagram transport cuts its datagrams to
    (IP and UDP headers included; 1500: Ethernet, 9000: jumbo frames, from
    576 to 65535); DLCP checks it against the routes toward its peers when it
    opens and refuses a larger one, since a datagram over the MTU would be
    fragmented. ``udp_offload``: let the datagram transport batch datagrams
    into one system call with UDP GSO and GRO where the kernel supports them
    (:mod:`commsched.transport.dlcp.udp`); False: one datagram per call.
    TCP and gloo ignore both (they follow the links' MTU themselves).
    ``freeze_gc``: a transport whose data path is a Python thread (the DLCP
    link, the ``ps`` transport's TCP link) runs one full pass of the garbage
    collector when it opens and keeps what is alive then out of later passes
    until it closes (:func:`commsched._gc.hold`), so that a full pass over the
    whole process (85-95 ms where torch is imported) no longer stalls its
    transfers; False leaves the collector as it is.
    """

    bind: str | None = None
    key: bytes | None = None
    paths: tuple[str, ...] = ()
    servers: tuple[int, ...] | None = None
    inject_loss: float = 0.0
    inject_seed: int = 0
    mtu_bytes: int = 1500
    udp_offload: bool = True
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        check_probability("TransportOptions.inject_loss", self.inject_loss)
        if isinstance(self.inject_seed, bool) or not isinstance(self.inject_seed, int):
            raise ValueError(f"TransportOptions.inject_seed: must be an integer, got {self.inject_seed!r}")
        check_mtu("TransportOptions.mtu_bytes", self.mtu_bytes)
        if not isinstance(self.udp_offload, bool):
            raise ValueError(f"TransportOptions.udp_offload: must be True or False, got {self.udp_offload!r}")
        if not isinstance(self.freeze_gc, bool):
            raise ValueError(f"TransportOptions.freeze_gc: must be True or False, got {self.freeze_gc!r}")


@dataclass(frozen=True, slots=True)
class TaskBuffer:
    """Where one task's data lives on this rank.

    ``flat``: the task's segments back to back (padded to a multiple of the
    world size when a shard exists); ``shard``: this rank's ``1/world`` of it,
    for reduce-scatter/all-gather pairs (``None`` otherwise).
    """

    flat: torch.Tensor
    shard: torch.Tensor | None = None


class Transport(Protocol):
    """Moves the bytes of tasks; every rank starts the same tasks in the same order."""

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        """Begin ``task`` over ``buffer``; return at once. The result is in ``buffer`` after ``wait()``."""
        ...

    def close(self) -> None:
        """Finish what was started (bounded by the transport's timeout) and release resources."""
        ...


def prepare_transport(transport: Transport, tasks: Iterable[CommTask]) -> None:
    """Before ``tasks`` run on ``transport``: let it open what they need and it has not opened yet (the
    collective transport's ring; collective: every rank, the same tasks, in the same order). Transports
    without a ``prepare(tasks)`` need nothing."""
    prepare = getattr(transport, "prepare", None)
    if prepare is not None:
        prepare(list(tasks))


class CollectiveTransport:
    """gloo/NCCL collectives: all-reduce in place; reduce-scatter ``flat`` → ``shard``; all-gather back.

    The ring that reduce-scatters and all-gathers CPU tensors opens with the first plan that has such
    tasks (:meth:`prepare`): plans of all-reduces never start its group's thread."""

    __slots__ = ("collectives",)

    def __init__(
        self, group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None
    ) -> None:
        #: the collectives the tasks run on (the warm-up times its per-message cost on them too)
        self.collectives = Collectives(group, timeout_s=timeout_s, options=options, open_ring=False)

    def prepare(self, tasks: list[CommTask]) -> None:
        """Open the ring if any of ``tasks`` reduce-scatters or all-gathers (collective)."""
        if self.collectives.shards_need_ring and any(task.kind in ("reduce_scatter", "all_gather") for task in tasks):
            self.collectives.open_ring()

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        if task.kind == "all_reduce":
            return self.collectives.all_reduce(buffer.flat)
        if buffer.shard is None or task.kind not in ("reduce_scatter", "all_gather"):
            raise UnsupportedError(
                f"transport {COLLECTIVE!r}: cannot run task {task.name!r} of kind {task.kind!r}; "
                "it runs all_reduce, reduce_scatter and all_gather"
            )
        if task.kind == "reduce_scatter":
            return self.collectives.reduce_scatter(buffer.flat, buffer.shard)
        return self.collectives.all_gather(buffer.shard, buffer.flat)

    def close(self) -> None:
        self.collectives.close()


def _parameter_server(group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions) -> Transport:
    """A server on every rank, over TCP (:class:`commsched.transport.ps.PsTransport`)."""
    from commsched.transport.ps import PsTransport  # it builds on this module

    return PsTransport(group, timeout_s, options)


def _dlcp(group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions) -> Transport:
    """DLCP datagrams, a shard on every rank (:class:`commsched.transport.bounded.DlcpTransport`)."""
    from commsched.transport.bounded import DlcpTransport

    return DlcpTransport(group, timeout_s, options)


def _dlcp_one_server(group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions) -> Transport:
    """DLCP datagrams, rank 0 the one server."""
    from commsched.transport.bounded import DlcpTransport

    return DlcpTransport(group, timeout_s, options, servers=(0,))


#: Transport factories by name: ``factory(group, timeout_s, options) -> Transport``.
TRANSPORTS: dict[str, Callable[[dist.ProcessGroup | None, float, TransportOptions], Transport]] = {
    COLLECTIVE: CollectiveTransport,
    PS_TRANSPORT: _parameter_server,
    DLCP_TRANSPORT: _dlcp,
    DLCP_PS_TRANSPORT: _dlcp_one_server,
}


#: Transports that move a buffer through their own sockets from host memory: they take CPU tensors only.
HOST_MEMORY: frozenset[str] = frozenset({PS_TRANSPORT, DLCP_TRANSPORT, DLCP_PS_TRANSPORT})


def check_transports(names: Iterable[str], devices: Iterable[torch.device] = ()) -> None:
    """Raise UnsupportedError naming any transport that is not registered, or one that takes CPU tensors
    only (:data:`HOST_MEMORY`) when ``devices`` (the model's parameters' devices) include another."""
    wanted = set(names)
    unknown = sorted(wanted - set(TRANSPORTS))
    if unknown:
        raise UnsupportedError(
            f"plan: transport(s) {', '.join(map(repr, unknown))} not available; known: {', '.join(TRANSPORTS)}"
        )
    elsewhere = sorted({str(d) for d in devices if torch.device(d).type != "cpu"})
    host = sorted(wanted & HOST_MEMORY)
    if elsewhere and host:
        raise UnsupportedError(
            f"plan: transport(s) {', '.join(map(repr, host))} send gradients from host memory and take CPU "
            f"tensors only, but the model has parameters on {', '.join(elsewhere)}; choose a policy that runs "
            "on collectives (ddp, dear, horovod, prophet, ...) or keep the model on the CPU"
        )


def open_transports(
    names: Iterable[str],
    group: dist.ProcessGroup | None,
    timeout_s: float,
    options: TransportOptions | None = None,
) -> dict[str, Transport]:
    """One transport per name (collective over ``group``: call on every rank in the same order)."""
    wanted = sorted(set(names))
    check_transports(wanted)
    opts = options if options is not None else TransportOptions()
    return {name: TRANSPORTS[name](group, timeout_s, opts) for name in wanted}
