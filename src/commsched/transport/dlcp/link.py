"""DLCP over UDP: a bounded-loss :class:`~commsched.transport.links.Link`.

``DlcpLink`` moves each transfer as MAC'd, offset-addressed datagrams
(:mod:`~commsched.transport.dlcp.wire`) driven by the clock-free state
machines of :mod:`~commsched.transport.dlcp.protocol`; one I/O thread per
link sends, receives and keeps time, off the training thread.

Guarantees
    * ``recv(..., loss_bound=b)`` finishes with at most ``floor(b · numel)``
      elements missing, and ``wait()`` returns them as ``missing`` ranges;
      at ``b = 0`` it returns only with every element. A receive that reaches
      its deadline (``timeout_s`` after it was posted) with more missing
      raises RuntimeCommError; so does one whose ``wait(timeout_s)`` ran out
      (it is cancelled). After ``wait()`` returns or raises, the link never
      writes into ``out`` again.
    * A datagram is written only after its MAC, its fields, and its fit to the
      posted receive (peer, key, dtype, numel, packet grid) are checked: a
      forged, truncated, out-of-range, duplicate, late or stale datagram is
      dropped and counted in :attr:`DlcpLink.stats`, never written.
    * Memory is bounded under a flood: datagrams for receives not yet posted
      are buffered up to ``early_limit_bytes`` (more are dropped; the
      sender's probe recovers them), finished keys and early entries of steps
      older than ``stale_steps`` behind the newest receive are dropped.
    * ``send`` reads ``data`` until its ``wait()`` returns: leave it unchanged
      until then. ``close()`` returns within ``min(timeout_s, 10 s)``.
    * A transfer's :meth:`DlcpTransfer.then` callbacks run once it has ended,
      in the thread that ended it: the I/O thread, holding the engine's lock
      (they may post transfers, which only queue; they must not wait for
      one), or a waiter that gave up.

Data: every datagram of a transfer crosses every path (per-packet
round-robin over the local path sockets and the peer's path addresses);
important packets (:func:`~commsched.transport.dlcp.protocol.classify`) go
first, ECN-capable, in their layer's DSCP class. Control (STOP, PROBE,
BITMAP, ACK) rides one TCP connection per ordered pair of ranks, every
message MAC'd like a datagram: control is a few messages per transfer, so
TCP's reliability and order cost nothing that matters, and a lost STOP or
BITMAP would otherwise need its own timers (the sender still re-probes).

Speed: datagrams go out in UDP GSO batches and come in as GRO batches where
the kernel supports them (:mod:`~commsched.transport.dlcp.udp`); the CPU
time per datagram on each side and the MB/s of a 16 MiB transfer over
loopback are measured by ``python benchmarks/dlcp_datapath.py`` (numbers in
``docs/dlcp.md``, "The data path").
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commsched._gc import hold, nothing_held
from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.transport.base import TransportOptions, check_mtu
from commsched.transport.dlcp.engine import Engine
from commsched.transport.dlcp.inject import RandomDrop
from commsched.transport.dlcp.protocol import classify, datagrams_per_ack
from commsched.transport.dlcp.rate import RateParams
from commsched.transport.dlcp.slots import LinkStats, RecvSlot, SendSlot
from commsched.transport.dlcp.sockets import Endpoints, LinkSockets, mtu_error, offload_report, path_mtu_problems
from commsched.transport.dlcp.wire import DTYPE_CODES, packet_numel
from commsched.transport.handles import Ended
from commsched.transport.links import COMPLETE, Received, TransferKey
from commsched.transport.wire import default_bind_address

log = logging.getLogger("commsched")
#: The pacer's burst holds at least this many datagrams of the link's MTU (and at least RateParams' 8 KiB), so
#: that a turn of the I/O loop can hand the kernel several datagrams in one GSO send: with 9000-byte frames an
#: 8 KiB burst lets one go per turn and per system call. docs/dlcp.md ("The data path") has the measurements.
BURST_DATAGRAMS = 4
_warned_rcvbuf = False  # the kernel's cap is reported once per process
_warned_small_mtu = False  # and datagrams too small for the data path's rate
#: The data path's datagrams per CPU second through the testbed with 9000-byte datagrams (BENCHMARKS.md, "DLCP's
#: tails and training with the loss tolerance"): at that rate a 1500-byte datagram carries 260-380 Mbit/s of
#: gradient per core, a 3999-byte one 720-1,060. Smaller datagrams cost less each (over loopback 2.2-2.5 times as
#: many per CPU second at 1500 bytes as at 9000: docs/dlcp.md, "The data path"), but not in proportion to their
#: size: at 1500 bytes resnet5m's training at 300 Mbit/s took 1.18 s per iteration against `ps`'s 0.71
#: (BENCHMARKS.md, "Every policy on today's code", with an older data path).
DATAGRAMS_PER_CPU_S = (23_000, 34_000)
#: Below this path MTU the warning below is given: the data path's rate per core, not the link, can set the pace on
#: the links of a few hundred Mbit/s to 1 Gbit/s this project is measured on, where jumbo frames lift it to 1.6-2.4
#: Gbit/s.
SMALL_MTU_BYTES = 4000


def small_mtu_warning(mtu_bytes: int) -> str | None:
    """What a user of ``mtu_bytes``-byte datagrams should know about the data path's speed, or None."""
    if mtu_bytes >= SMALL_MTU_BYTES:
        return None
    payload_bytes = packet_numel(mtu_bytes, 1)  # a datagram's gradient bytes
    low, high = (rate * payload_bytes * 8 / 1e6 for rate in DATAGRAMS_PER_CPU_S)
    return (
        f"dlcp: datagrams of {mtu_bytes} bytes: the data path moves about {DATAGRAMS_PER_CPU_S[0]:,}-"
        f"{DATAGRAMS_PER_CPU_S[1]:,} datagrams of 9000 bytes per CPU second (smaller ones somewhat more), at that "
        f"rate {low:.0f}-{high:.0f} Mbit/s of gradient per core at this size, so on faster links it, not the link, "
        "sets the pace; give jumbo frames where the links carry them (TransportOptions(mtu_bytes=9000), "
        "commsched bench --mtu 9000), or use policy='ps' (TCP)"
    )


def pacer_burst_bytes(mtu_bytes: int) -> float:
    """The link's pacing burst for datagrams of ``mtu_bytes``: :data:`BURST_DATAGRAMS` of them, at least 8 KiB."""
    return float(max(RateParams().burst_bytes, BURST_DATAGRAMS * mtu_bytes))


class DlcpTransfer:
    """A pending send or receive (the link's :class:`~commsched.transport.links.Transfer`); :meth:`then` calls
    back in the thread that ends it (the module docstring)."""

    __slots__ = ("_done", "_error", "_link", "_result", "slot")

    def __init__(self, link: DlcpLink, slot: SendSlot | RecvSlot) -> None:
        self._link = link
        self._done = Ended()
        self._error: str | None = None
        self._result: Received = COMPLETE
        self.slot = slot

    def finish(self, result: Received = COMPLETE, error: str | None = None) -> None:
        """End the transfer (the first call counts) and free its key for another post."""
        if self._done.is_set():
            return
        self._result, self._error = result, error
        self._link._engine.release(self.slot)
        self.slot.transfer = None  # no cycle with the slot: an ended transfer's objects go with their last reference
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def then(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` in the thread that ends the transfer; False (and nothing registered) if it has ended.

        ``fn`` runs holding the link's lock when the I/O thread ends the transfer; it may post, and detach."""
        return self._done.then(fn)

    def detach(self) -> bool:
        """A send reads a copy of its data from now on: its caller may change the tensor (the send goes on until
        its receiver says STOP, re-sending what was lost from the copy); True. Nothing for a receive or an ended
        send (True). :class:`~commsched.transport.exchange_tasks.Chained` ends a task so, without waiting a
        round trip for the STOPs of its last sends.

        Only the link's I/O thread detaches (it holds the link's lock whenever it ends a transfer, so its
        callbacks may); anywhere else this returns False and changes nothing: taking the lock there could wait
        on an I/O thread that waits, in a callback, for a lock the caller holds."""
        slot = self.slot
        if not isinstance(slot, SendSlot) or self._done.is_set():
            return True
        if not self._link._engine.on_io_thread():
            return False
        slot.classify()  # from the caller's tensor, while it is unchanged
        slot.view = memoryview(bytes(slot.view))
        return True

    def wait(self, timeout_s: float | None = None) -> Received:
        if not self._done.wait(timeout_s):
            self._link._engine.cancel(self.slot)  # after this the link writes nothing more
            if not self._done.is_set():
                self.finish(error="cancelled")
            if self._error == "cancelled":
                raise RuntimeCommError(f"dlcp: {self.slot.describe()} not finished after wait({timeout_s}); cancelled")
        if self._error is not None:
            raise RuntimeCommError(f"dlcp: {self.slot.describe()}: {self._error}")
        return self._result


class DlcpLink:
    """Keyed bounded-loss transfers between the ranks of one job over UDP (see the module docstring).

    ``sockets``: this rank's bound sockets; ``peers[r]``: rank ``r``'s
    endpoints (this rank's own entry is ignored); ``key``: the job's 16-64
    byte key. ``mtu_bytes``: the path MTU datagrams are cut to (1500; 9000
    with jumbo frames); SpecError if a route toward a peer has a smaller one
    (:func:`~commsched.transport.dlcp.sockets.path_mtu_problems`). Whether
    datagrams are batched (UDP GSO/GRO) is the ``sockets``' choice
    (``LinkSockets(udp_offload=...)``), reported in :attr:`offload`.
    ``drop``: ``drop(peer, offset) -> True`` loses that outgoing DATA
    datagram (counted in ``stats.dropped_by_hook``): emulated loss
    (:class:`~commsched.transport.dlcp.inject.RandomDrop`) or a test's.
    ``stop_at_count``: end a bounded receive as soon as ``1 − loss_bound`` of
    it arrived (MLT's rule) instead of only on what the network lost
    (:class:`~commsched.transport.dlcp.protocol.ReceiverState`).
    """

    def __init__(
        self,
        rank: int,
        world: int,
        sockets: LinkSockets,
        peers: Sequence[Endpoints],
        key: bytes,
        *,
        timeout_s: float = 60.0,
        mtu_bytes: int = 1500,
        rate: RateParams | None = None,
        quantile: float = 0.5,
        important_layer_classes: int = 1,
        early_limit_bytes: int = 64 << 20,
        stale_steps: int = 2,
        drop: Callable[[int, int], bool] | None = None,
        stop_at_count: bool = False,
    ) -> None:
        if len(peers) != world or not 0 <= rank < world:
            raise ValueError(f"dlcp: rank {rank} of {world} with {len(peers)} peer endpoints")
        check_mtu("dlcp: mtu_bytes", mtu_bytes)
        problems = path_mtu_problems(sockets, peers, rank, mtu_bytes)
        if problems:
            raise mtu_error(mtu_bytes, problems)
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        self.mtu_bytes = mtu_bytes
        self._release_gc: Callable[[], None] = nothing_held  # open_dlcp_link's hold on the collector's freeze
        self.quantile = quantile
        self.important_layer_classes = important_layer_classes
        #: the local UDP ports of the data paths (where the kernel counts this link's receive drops)
        self.data_ports = tuple(port for _, port in sockets.endpoints.data)
        self.stats = LinkStats(
            rcvbuf_requested_bytes=sockets.rcvbuf_requested_bytes,
            rcvbuf_granted_bytes=sockets.rcvbuf_granted_bytes,
            rmem_max_bytes=sockets.rmem_max_bytes,
        )
        self._ip_udp_bytes = 48 if ":" in sockets.endpoints.control[0] else 28
        #: how datagrams are sent and read: batched with UDP GSO / GRO, or one per system call, and why
        self.offload = offload_report(sockets)
        global _warned_rcvbuf
        if sockets.rcvbuf_limited and not _warned_rcvbuf:
            _warned_rcvbuf = True
            log.warning(
                "dlcp: the kernel granted %d bytes of receive buffer of the %d asked for (net.core.rmem_max = %s); "
                "a receiver stall of 100 ms at 1.25 GB/s would lose datagrams (raise net.core.rmem_max)",
                sockets.rcvbuf_granted_bytes, sockets.rcvbuf_requested_bytes, sockets.rmem_max_bytes,
            )  # fmt: skip
        global _warned_small_mtu
        small = small_mtu_warning(mtu_bytes)
        if small is not None and not _warned_small_mtu:
            _warned_small_mtu = True
            log.warning(small)
        # acknowledge about every 96 KiB (ACK_EVERY_BYTES); the window holds what a receiver holds unacknowledged
        ack_every = datagrams_per_ack(mtu_bytes)
        rate = rate if rate is not None else RateParams(ack_slack=ack_every, burst_bytes=pacer_burst_bytes(mtu_bytes))
        self._engine = Engine(
            rank, world, sockets, peers, key, self.stats, timeout_s=timeout_s, rate=rate, ack_every=ack_every,
            early_limit_bytes=early_limit_bytes, stale_steps=stale_steps, drop=drop, stop_at_count=stop_at_count,
        )  # fmt: skip

    @property
    def rcvbuf_limited(self) -> bool:
        """The kernel (``net.core.rmem_max``) granted less receive buffer than a stall of 100 ms needs."""
        return self.stats.rcvbuf_granted_bytes < self.stats.rcvbuf_requested_bytes

    def rate_counters(self) -> dict[int, dict[str, float]]:
        """Each destination's rate control so far (:class:`~commsched.transport.dlcp.rate.RateControl`'s
        counters): ``decreases``, ``undone``, ``timeouts``, ``rounds``, ``lost``, ``refused``, ``reordered``, and
        now the ``rate_bytes_per_s``, ``srtt_s`` and ``min_rtt_s``. Read from the I/O thread's state without a lock:
        a reading taken while it runs may mix two moments."""
        names = ("decreases", "undone", "timeouts", "rounds", "lost", "refused", "reordered", "rate_bytes_per_s",
                 "srtt_s", "min_rtt_s")  # fmt: skip
        rates = self._engine.outbound.rates
        return {peer: {n: getattr(rates[peer], n) for n in names} for peer in range(self.world) if peer != self.rank}

    def _check(self, peer: int, tensor: torch.Tensor, what: str) -> tuple[int, int]:
        if not 0 <= peer < self.world or peer == self.rank:
            raise ValueError(f"dlcp: {what} with rank {peer} (this is rank {self.rank} of {self.world})")
        if tensor.device.type != "cpu" or tensor.dim() != 1 or not tensor.is_contiguous():
            raise UnsupportedError(f"dlcp: {what} takes a contiguous 1-D CPU tensor, got {tuple(tensor.shape)}")
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"dlcp: dtype {tensor.dtype} has no wire code; known: {', '.join(DTYPE_CODES)}")
        return DTYPE_CODES[name], tensor.element_size()

    def send(
        self, peer: int, key: TransferKey, data: torch.Tensor, *, priority: int = 0, loss_bound: float | None = None
    ) -> DlcpTransfer:
        """Start sending ``data`` to ``peer``; the transfer completes when the receiver says STOP. The packets are
        classified by importance (:func:`~commsched.transport.dlcp.protocol.classify`) unless ``priority`` is a
        front layer class, the link's quantile is 0, or ``loss_bound`` (the receive's, where the caller knows it)
        is 0: a receiver that takes every packet has none to be dropped first (as in the packet simulator). The
        I/O thread classifies just before the first packet goes: posting costs the caller no pass over its data
        (docs/dlcp.md, "Posting a send costs the caller little")."""
        dtype, itemsize = self._check(peer, data, "send")
        if loss_bound is not None and not 0.0 <= loss_bound <= 1.0:
            raise ValueError(f"dlcp: send loss_bound must be in [0, 1] or None, got {loss_bound!r}")
        stride = packet_numel(self.mtu_bytes, itemsize, self._ip_udp_bytes)
        later = None  # every packet important; else the I/O thread classifies them
        if (data.is_floating_point() and data.numel() and priority >= self.important_layer_classes and self.quantile
                and loss_bound != 0):  # fmt: skip

            def later() -> np.ndarray:
                front = self.important_layer_classes
                return classify(_chunk_norms(data, stride), priority, self.quantile, important_layer_classes=front)

        view = data.view(torch.uint8).numpy().data if data.numel() else memoryview(b"")
        slot = SendSlot(peer, TransferKey(*key), view, data.numel(), itemsize, dtype, stride, priority, None, later)
        transfer = DlcpTransfer(self, slot)
        self._engine.post(slot, transfer)
        return transfer

    def recv(self, peer: int, key: TransferKey, out: torch.Tensor, *, loss_bound: float = 0.0) -> DlcpTransfer:
        """Start receiving into ``out`` from ``peer``; ``wait()`` gives the element ranges that did not arrive."""
        dtype, itemsize = self._check(peer, out, "recv")
        view = out.view(torch.uint8).numpy().data if out.numel() else memoryview(bytearray())
        slot = RecvSlot(peer, TransferKey(*key), view, out.numel(), itemsize, dtype, loss_bound)
        transfer = DlcpTransfer(self, slot)
        self._engine.post(slot, transfer)
        return transfer

    def close(self) -> None:
        """Stop the I/O thread (within about ``timeout_s``), fail what is pending, close the sockets; give back
        the garbage collector's freeze :func:`open_dlcp_link` took."""
        self._engine.close(min(self.timeout_s, 10.0))
        self._release_gc()

    def __enter__(self) -> DlcpLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunk_norms(data: torch.Tensor, stride: int) -> np.ndarray:
    """The L2 norm of each packet's chunk of ``data`` (float32 arithmetic), without copying a float32 ``data``."""
    flat = data.detach().view(-1).float()
    n = flat.numel()
    full = n - n % stride
    norms = torch.empty(-(-n // stride))
    if full:
        torch.linalg.vector_norm(flat[:full].view(-1, stride), dim=1, out=norms[: full // stride])
    if full < n:
        norms[-1] = torch.linalg.vector_norm(flat[full:])
    return norms.numpy()


def _fingerprint(key: bytes | None) -> bytes | None:
    return None if key is None else hashlib.blake2b(key, digest_size=8, person=b"commsched.fp").digest()


def open_dlcp_link(
    group: dist.ProcessGroup | None, timeout_s: float, options: TransportOptions | None = None, **knobs: Any
) -> DlcpLink:
    """Open a :class:`DlcpLink` on every rank of ``group`` (collective: every rank calls it).

    Binds to ``options.bind`` (default: the address that routes to
    ``MASTER_ADDR``, as the TCP link's :func:`~commsched.transport.wire.default_bind_address`) and each of
    ``options.paths``, then exchanges endpoints with ``dist.all_gather_object``
    over ``group`` (gloo). The key is ``options.key`` (every rank must give
    the same one: RuntimeCommError otherwise) or, if None everywhere, 32
    random bytes rank 0 draws with :mod:`secrets` and shares in the same
    exchange — so it is not secret from anyone who can read that group's
    traffic; give a key to every rank out of band where that matters.
    ``options.inject_loss`` > 0 drops that fraction of this rank's data
    datagrams (:class:`~commsched.transport.dlcp.inject.RandomDrop`, seeded
    by ``options.inject_seed`` and the rank) unless ``knobs`` bring a ``drop``.
    ``options.mtu_bytes`` is the path MTU datagrams are cut to: every rank
    checks it against its routes toward the others, and all raise SpecError
    together if one does not fit; ``options.udp_offload`` False sends and
    reads one datagram per system call. ``options.freeze_gc`` (the default)
    keeps what is alive before the link is made out of the garbage
    collector's later full passes while the link is open (:mod:`commsched._gc`),
    which would stall the link's I/O thread. ``knobs`` go to :class:`DlcpLink`
    (``rate``, ``stop_at_count``, ...; a ``mtu_bytes`` there wins over the
    options').
    """
    opts = options if options is not None else TransportOptions()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if opts.inject_loss > 0 and "drop" not in knobs:
        knobs["drop"] = RandomDrop(opts.inject_loss, opts.inject_seed, rank)
    mtu_bytes = check_mtu("dlcp: mtu_bytes", knobs.pop("mtu_bytes", opts.mtu_bytes))
    bind = opts.bind if opts.bind is not None else default_bind_address()
    sockets = LinkSockets(bind, opts.paths, udp_offload=opts.udp_offload)
    # before the link's state exists (that stays the collector's), until the link closes
    release_gc = hold() if opts.freeze_gc else nothing_held
    try:
        drawn = secrets.token_bytes(32) if opts.key is None and rank == 0 else None
        mine = (sockets.endpoints, drawn, _fingerprint(opts.key))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine, group=group)
        if len({g[2] for g in gathered}) != 1:
            raise RuntimeCommError("dlcp: the ranks were given different keys (TransportOptions.key)")
        key = opts.key if opts.key is not None else gathered[0][1]
        peers = [g[0] for g in gathered]
        problems: list[Any] = [None] * world  # every rank learns every rank's, so that all refuse together
        dist.all_gather_object(problems, path_mtu_problems(sockets, peers, rank, mtu_bytes), group=group)
        if any(problems):
            raise mtu_error(mtu_bytes, [p for ps in problems for p in ps])
        link = DlcpLink(rank, world, sockets, peers, key, timeout_s=timeout_s, mtu_bytes=mtu_bytes, **knobs)
    except BaseException:
        sockets.close()
        release_gc()
        raise
    link._release_gc = release_gc
    return link
