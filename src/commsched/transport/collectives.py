"""Asynchronous, bandwidth-optimal collectives for the runtime.

Three collectives on flat buffers, each returning a :class:`Handle` at once::

    coll = Collectives(dist.new_group())
    h = coll.reduce_scatter(flat, shard)   # shard = SUM over ranks of flat.chunk(world)[rank]
    ...                                    # compute overlaps the transfer
    h.wait()                               # shard is valid from here on

Guarantees
    * Every op returns immediately; its result is valid after ``wait()``.  Ops
      are matched across ranks in issue order, so every rank must issue the same
      ops in the same order (one communication thread per process).
    * ``reduce_scatter`` and ``all_gather`` need ``flat.numel() == world_size *
      shard.numel()``; callers pad.  A wrong size raises ``ValueError`` at issue.
      Only SUM is used (AVG is not portable): divide by ``world_size`` yourself.
    * A failure (a dead or hung peer, a timeout) surfaces from ``wait()`` as
      :class:`~commsched.errors.RuntimeCommError` naming the op, the peer when
      known, and the cause.  Each ring step is bounded by ``timeout_s`` and the
      backend's ops by the group's timeout, so ``wait()`` never hangs forever;
      ``wait(timeout_s)`` bounds it further.  Once a ring op has failed, every
      ring op behind it fails at once: the ranks no longer agree on the ring.

How each backend runs them (``ring=None`` picks per backend)
    * gloo, CPU tensors: ``reduce_scatter`` and ``all_gather`` are rings of
      ``p - 1`` point-to-point steps, each rank sending ``(p - 1)/p · S`` bytes,
      the bandwidth lower bound; ``all_reduce`` is gloo's own.  gloo's
      ``reduce_scatter_tensor`` is an all-reduce followed by a slice (PyTorch PR
      #118911), and its ``all_gather_into_tensor`` measures slower than the
      ring from 4 MiB up.  ``python benchmarks/collectives.py --world 2 4``
      (torch 2.13 CPU, gloo over loopback on 2 CPUs shared with other work, one
      intra-op thread per rank; median ms of the slowest rank over 21 repeats)::

          world  MiB   all_reduce  gloo RS  gloo AG  ring RS  ring AG   RS+AG/AR: gloo  ring
            2      1      2.1        3.4      2.4      4.6      4.3              2.83  4.32
            2      4      6.5        9.6      5.9      4.8      5.1              2.39  1.54
            2     16     24.8       32.4     21.7     16.4     16.7              2.18  1.33
            2     32     37.8       80.6     66.2     27.2     22.8              3.88  1.32
            4      1     10.5        8.5      8.2     11.2     11.5              1.59  2.18
            4      4     10.4       13.7      8.8      9.9      6.2              2.17  1.55
            4     16     36.6       47.1     25.3     26.2     21.2              1.98  1.29
            4     32     74.2      118.9     81.5     50.4     39.7              2.70  1.21

      Over three runs, from 16 MiB up the ring won both ops every time, and at
      4 MiB 11 of 12 comparisons; a DeAR-style reduce-scatter + all-gather then
      costs 1.2-1.8x an all-reduce instead of 1.85-3.9x.  At 1 MiB the ring is
      latency-bound (``p - 1`` handoffs to a Python thread): with 2 ranks it won
      2 of 3 runs (1.2 vs 3.0 ms once), with 4 ranks on the 2 loaded cores it
      lost all 3 by 3-41 %.  On real links bandwidth dominates from smaller
      messages still, so the ring is not switched off below a size.
    * NCCL (CUDA tensors): the backend's own ``reduce_scatter_single`` /
      ``all_gather_single`` (``reduce_scatter_tensor`` /
      ``all_gather_into_tensor`` before torch 2.13, which is why no FutureWarning
      needs filtering) and ``all_reduce``.  NCCL's rings are already optimal and
      run on NCCL's own stream; ``wait()`` makes the current CUDA stream wait and
      does not block the host (unless given a timeout).
    * CUDA tensors on gloo: gloo's own ops, which stage through host memory
      themselves; a CPU ring would only add copies.  The ring only ever runs on
      CPU tensors, whatever ``ring`` says.
Collectives of CPU tensors over the direct connections (gloo)
    Between 2 ranks every all-reduce, among more those where each rank sends
    at most :data:`~commsched.transport.direct.DIRECT_MAX_BYTES`, go over TCP
    connections of their own, written by the thread that starts them and read
    by the one that waits (:mod:`commsched.transport.direct`: a 4 KiB
    all-reduce took 847 µs of CPU through gloo, 23 µs as a plain TCP
    exchange). The others, and every one with ``direct=False``, are gloo's.
    Between 2 ranks reduce-scatters and all-gathers go there too, whatever
    ``ring`` says (the ring of 2 is the same one exchange, a thread hand-off
    later); the ring then never opens.

Threads and process groups
    Ring ops run on one worker thread per :class:`Collectives`, in issue order,
    over a gloo group of their own: :mod:`commsched.transport.ring`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from commsched.errors import RuntimeCommError
from commsched.transport.direct import DirectCollectives
from commsched.transport.handles import DoneHandle, Handle, WorkHandle
from commsched.transport.ring import RingWorker

if TYPE_CHECKING:  # base imports this module
    from commsched.transport.base import TransportOptions

__all__ = ["Collectives"]


def _resolve(new_name: str, old_name: str) -> Callable[..., Any]:
    """The non-deprecated spelling when this torch has it (2.13+), else the old one."""
    fn = getattr(dist, new_name, None)
    return fn if fn is not None else getattr(dist, old_name)


_reduce_scatter_backend = _resolve("reduce_scatter_single", "reduce_scatter_tensor")
_all_gather_backend = _resolve("all_gather_single", "all_gather_into_tensor")


class Collectives:
    """All-reduce, reduce-scatter and all-gather on one process group, all asynchronous.

    ``group``: a process group dedicated to these collectives (``None``: the default
    group).  ``timeout_s`` bounds every transfer of the ring; the backend's own ops
    are bounded by ``group``'s timeout.  ``ring``: ``True`` runs reduce-scatter and
    all-gather as point-to-point rings on CPU tensors, ``False`` uses the backend's
    own, ``None`` picks per backend (see the module docstring). ``direct``:
    all-reduces of CPU tensors (and between 2 ranks reduce-scatters and all-gathers)
    go over TCP connections of their own (:mod:`commsched.transport.direct`;
    ``None``: where the backend is gloo), which listen and authenticate as ``options`` say.

    Construction is collective over ``group`` when the ring or the direct connections
    are in use (it creates the ring's process group, and opens the connections); call it
    on every rank of ``group`` in the same order. ``ring`` then says, after ``None`` was
    resolved, whether CPU tensors use the ring where the direct connections do not take them
    (:attr:`shards_need_ring`), and ``direct`` whether all-reduces of CPU tensors go over the
    direct connections (:meth:`~commsched.transport.direct.DirectCollectives.takes`).
    ``open_ring=False`` leaves the ring's group to :meth:`open_ring` (a gloo group's event
    loop wakes 100 times a second even while nothing uses it): a reduce-scatter or all-gather
    that would take the ring before then fails at issue.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        timeout_s: float = 300.0,
        ring: bool | None = None,
        direct: bool | None = None,
        options: TransportOptions | None = None,
        open_ring: bool = True,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.group = group if group is not None else dist.group.WORLD
        self.timeout_s = timeout_s
        self.world_size: int = dist.get_world_size(self.group)
        self.rank: int = dist.get_rank(self.group)
        self.backend: str = str(dist.get_backend(self.group))
        self._ranks = list(dist.get_process_group_ranks(self.group))

        # "gloo", or e.g. "cpu:gloo,cuda:nccl" when one group serves both devices
        self.ring: bool = ("gloo" in self.backend) if ring is None else ring

        self._seq = 0
        self._closed = False
        self.direct: bool = ("gloo" in self.backend if direct is None else direct) and self.world_size > 1
        self._direct = DirectCollectives(self.group, timeout_s, options) if self.direct else None
        self._ring_worker = RingWorker(self.rank, self.world_size, timeout_s)
        self._ring_open = False
        if open_ring:
            try:
                self.open_ring()
            except BaseException:
                if self._direct is not None:
                    self._direct.close()
                raise

    @property
    def shards_need_ring(self) -> bool:
        """Whether reduce-scatters and all-gathers of CPU tensors run on the ring (not the direct connections)."""
        return self.ring and self.world_size > 1 and not (self.direct and self.world_size == 2)

    def open_ring(self) -> None:
        """Create the ring's process group and start its thread, where the ring is in use and not yet open
        (collective over the group: every rank, in the same order)."""
        if self.ring and self.world_size > 1 and not self._ring_open:
            self._ring_worker.start(self._ranks)
            self._ring_open = True

    # ------------------------------------------------------------------ public ops

    def all_reduce(self, flat: torch.Tensor) -> Handle:
        """In-place SUM of ``flat`` over all ranks."""
        if not flat.is_contiguous():
            raise ValueError(
                f"all_reduce: flat must be contiguous, got strides {flat.stride()} for {tuple(flat.shape)}"
            )
        describe = self._describe("all_reduce", flat)
        if self.world_size == 1 or flat.numel() == 0:
            return DoneHandle()
        if self._direct is not None and DirectCollectives.takes(flat, self.world_size):
            return self._direct.start(flat, describe)
        return self._backend(describe, lambda: dist.all_reduce(flat, group=self.group, async_op=True))

    def reduce_scatter(self, flat: torch.Tensor, shard: torch.Tensor) -> Handle:
        """``shard`` = SUM over ranks of ``flat.chunk(world_size)[rank]``; ``flat`` is left unchanged."""
        self._check_sizes("reduce_scatter", flat, shard)
        describe = self._describe("reduce_scatter", flat)
        if self.world_size == 1 or shard.numel() == 0:
            shard.view(-1).copy_(flat.view(-1))
            return DoneHandle()
        if self._direct is not None and DirectCollectives.takes_shards(flat, self.world_size):
            return self._direct.start_reduce_scatter(flat, shard, describe)
        if self.ring and flat.device.type == "cpu":
            return self._enqueue("reduce_scatter", describe, flat, shard)
        return self._backend(
            describe,
            lambda: _reduce_scatter_backend(shard, flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
        )

    def all_gather(self, shard: torch.Tensor, flat: torch.Tensor) -> Handle:
        """``flat.chunk(world_size)[r]`` = ``shard`` of rank ``r``."""
        self._check_sizes("all_gather", flat, shard)
        describe = self._describe("all_gather", flat)
        if self.world_size == 1 or shard.numel() == 0:
            flat.view(-1).copy_(shard.view(-1))
            return DoneHandle()
        if self._direct is not None and DirectCollectives.takes_shards(flat, self.world_size):
            return self._direct.start_all_gather(shard, flat, describe)
        if self.ring and flat.device.type == "cpu":
            return self._enqueue("all_gather", describe, flat, shard)
        return self._backend(describe, lambda: _all_gather_backend(flat, shard, group=self.group, async_op=True))

    def close(self) -> None:
        """Finish the queued ring ops (each bounded by ``timeout_s``), then stop the worker.

        The ring's process group is released where that is safe
        (:mod:`commsched.transport.groups`): destroying a group can make torch (<= 2.13)
        reuse the name of a later locally synchronised group, whose rendezvous then meets
        stale addresses, so while such a group lives it stays registered.
        """
        if self._closed:
            return
        self._closed = True
        self._ring_worker.stop()
        if self._direct is not None:
            self._direct.close()

    # ------------------------------------------------------------------ helpers

    def _describe(self, kind: str, flat: torch.Tensor) -> str:
        if self._closed:
            raise RuntimeCommError(f"{kind} issued on a closed Collectives")
        self._seq += 1
        return f"{kind} #{self._seq} ({flat.numel() * flat.element_size()} bytes, {self.backend}, rank {self.rank})"

    def _check_sizes(self, kind: str, flat: torch.Tensor, shard: torch.Tensor) -> None:
        if flat.numel() != self.world_size * shard.numel():
            raise ValueError(
                f"{kind}: flat has {flat.numel()} elements, expected world_size ({self.world_size}) × "
                f"shard.numel() ({shard.numel()}) = {self.world_size * shard.numel()}; "
                f"pad flat to a multiple of {self.world_size} and size shard as flat.numel() // {self.world_size}"
            )
        if flat.dtype != shard.dtype or flat.device != shard.device:
            raise ValueError(
                f"{kind}: flat and shard must share dtype and device, got flat {flat.dtype} on {flat.device}, "
                f"shard {shard.dtype} on {shard.device}"
            )
        for name, t in (("flat", flat), ("shard", shard)):
            if not t.is_contiguous():
                raise ValueError(f"{kind}: {name} must be contiguous, got strides {t.stride()} for {tuple(t.shape)}")

    def _backend(self, describe: str, issue: Callable[[], dist.Work | None]) -> Handle:
        try:
            work = issue()
        except Exception as exc:
            return DoneHandle(RuntimeCommError(f"{describe} failed at issue: {exc}"))
        assert work is not None, "async_op=True always returns a Work"
        return WorkHandle(work, describe)

    def _enqueue(self, kind: str, describe: str, flat: torch.Tensor, shard: torch.Tensor) -> Handle:
        if not self._ring_open:
            return DoneHandle(RuntimeCommError(f"{describe} failed at issue: the ring is not open (open_ring())"))
        return self._ring_worker.submit(kind, self._seq, describe, flat, shard)
