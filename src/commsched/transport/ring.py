"""Ring reduce-scatter and all-gather over gloo point-to-point, run in issue order on a worker thread.

:class:`RingWorker` runs the ring ops of one
:class:`~commsched.transport.collectives.Collectives` on CPU tensors (that
module says when the ring is used, and what it measured against gloo's own
ops). An op of ``p`` ranks is ``p - 1`` steps, each sending one chunk to the
right neighbour and receiving one from the left, each bounded by ``timeout_s``.

Threads and process groups
    Ring steps run one after another, so ring ops go to one worker thread per
    :class:`~commsched.transport.collectives.Collectives`, serving a FIFO
    queue: issue order is kept and the caller never blocks.  The ring's
    point-to-point traffic uses a gloo group of its own, created by
    :meth:`RingWorker.start` (so constructing ``Collectives`` is collective over
    its ``group``).  Measured on the same 2- and 4-rank setup, ring ops
    concurrent with gloo collectives ran as fast on ``group`` itself as on a
    group of their own (the difference was within noise); the own group wins on
    isolation: its connections, gloo worker threads and ``(peer, tag)``
    matching are untouched by whatever ``group`` runs, so correctness does not
    hinge on how gloo's algorithms number their slots next to our tags.  Tags
    number op instances and kinds, so ranks that disagree on the op sequence
    fail instead of summing the wrong buffers.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.transport.groups import release_groups
from commsched.transport.handles import RingHandle

__all__ = ["RingWorker"]

# gloo tags are non-negative 32-bit ints.
_TAG_MODULUS = 2**31 - 1


@dataclass(frozen=True, slots=True)
class _RingOp:
    kind: str  # "reduce_scatter" | "all_gather"
    flat: torch.Tensor  # 1-D view of the caller's flat buffer
    shard: torch.Tensor  # 1-D view of the caller's shard
    tag: int
    handle: RingHandle


class RingWorker:
    """The worker thread, queue and point-to-point group of the ring ops of one ``Collectives``.

    ``rank`` and ``world_size``: this rank's place in the group; ``timeout_s`` bounds every
    ring step. Nothing runs until :meth:`start`; :meth:`submit` queues an op, :meth:`stop`
    finishes the queued ones and ends the thread. Once an op has failed, every op behind it
    fails at once.
    """

    def __init__(self, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        # ring neighbours, as ranks of the group (the p2p group has the same ranks)
        self._right = (rank + 1) % world_size
        self._left = (rank - 1) % world_size
        self._failure: RuntimeCommError | None = None
        # buffers and works of a failed step, kept alive while gloo may still write into them
        self._abandoned: list[Any] = []
        # worker-thread only: receive buffers of the ring reduce-scatter, 2 shards of the largest op
        self._scratch_by_dtype: dict[torch.dtype, torch.Tensor] = {}
        self._p2p_group: dist.ProcessGroup | None = None
        self._queue: queue.SimpleQueue[_RingOp | None] = queue.SimpleQueue()
        self._worker = daemon_thread(self._serve, f"commsched-ring-r{rank}")

    def start(self, ranks: list[int]) -> None:
        """Create the ring's process group over ``ranks`` (collective over them) and start the thread."""
        # A group over every rank gets torch's sequential name.  A subgroup needs local
        # synchronisation (non-members do not call us), whose name torch salts with the
        # number of live groups on this process (torch <= 2.13, pytorch PR #189073).
        self._p2p_group = dist.new_group(
            ranks,
            timeout=timedelta(seconds=self.timeout_s),
            backend="gloo",
            use_local_synchronization=len(ranks) < dist.get_world_size(),
        )
        self._worker.start()

    def submit(self, kind: str, seq: int, describe: str, flat: torch.Tensor, shard: torch.Tensor) -> RingHandle:
        """Queue ring op ``kind`` (``"reduce_scatter"`` or ``"all_gather"``), number ``seq`` of its ``Collectives``."""
        handle = RingHandle(describe, self._worker)
        tag = (2 * seq + (kind == "all_gather")) % _TAG_MODULUS
        self._queue.put(_RingOp(kind, flat.view(-1), shard.view(-1), tag, handle))
        return handle

    def stop(self) -> None:
        """Finish the queued ops (each bounded by ``timeout_s``), then stop the thread and, unless an op
        failed (gloo may still write into its buffers), release the ring's group
        (:func:`~commsched.transport.groups.release_groups`)."""
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()
        if self._failure is None and release_groups([self._p2p_group]):
            self._p2p_group = None

    def _serve(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            if self._failure is not None:
                op.handle.finish(
                    RuntimeCommError(f"{op.handle.describe} not run: an earlier ring op failed ({self._failure})")
                )
                continue
            op.handle.started_s = time.perf_counter()
            try:
                if op.kind == "reduce_scatter":
                    self._ring_reduce_scatter(op)
                else:
                    self._ring_all_gather(op)
            except RuntimeCommError as exc:
                self._failure = exc
                op.handle.finish(exc)
            except BaseException as exc:
                self._failure = RuntimeCommError(f"{op.handle.describe} failed: {exc!r}")
                op.handle.finish(self._failure)
            else:
                op.handle.finish()

    def _exchange(self, op: _RingOp, step: int, send: torch.Tensor, recv: torch.Tensor, deadline: float) -> None:
        """One ring step: send to the right neighbour, receive from the left, wait for both."""
        where = f"{op.handle.describe} at ring step {step + 1}/{self.world_size - 1}"
        group = self._p2p_group
        assert group is not None
        pending: list[tuple[dist.Work, int, str]] = []
        try:
            # the ProcessGroup's own send/recv take group ranks and skip dist.isend's per-call checks
            pending.append((group.recv([recv], self._left, op.tag), self._left, "receiving from"))
            pending.append((group.send([send], self._right, op.tag), self._right, "sending to"))
        except Exception as exc:
            self._abandoned.append((send, recv, pending))
            raise RuntimeCommError(f"{where} failed at issue: {exc}") from exc
        for i, (work, peer, verb) in enumerate(pending):
            remaining_s = deadline - time.monotonic()
            try:
                if remaining_s <= 0:
                    raise TimeoutError(f"no progress within timeout_s={self.timeout_s:g}")
                work.wait(timedelta(seconds=remaining_s))
            except Exception as exc:
                self._abandoned.append((send, recv, pending[i:]))
                raise RuntimeCommError(f"{where} failed {verb} rank {peer}: {exc}") from exc

    def _scratch(self, shard: torch.Tensor) -> torch.Tensor:
        """Two shard-sized receive buffers, reused across ops (fresh large allocations page-fault)."""
        numel = 2 * shard.numel()
        buf = self._scratch_by_dtype.get(shard.dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=shard.dtype)
            self._scratch_by_dtype[shard.dtype] = buf
        return buf[:numel]

    def _ring_reduce_scatter(self, op: _RingOp) -> None:
        """At step s rank r sends its partial sum of chunk r-s-1 and adds the one it receives to chunk r-s-2.

        After p-1 steps chunk r holds the contributions of all p ranks.  Two chunk-sized
        buffers alternate (one being sent, one being received into), so ``flat`` is only read.
        """
        p, r = self.world_size, self.rank
        chunks = op.flat.chunk(p)
        buffers = self._scratch(op.shard).chunk(2)
        send = chunks[(r - 1) % p]
        for step in range(p - 1):
            recv = buffers[step % 2]
            self._exchange(op, step, send, recv, time.monotonic() + self.timeout_s)
            own = chunks[(r - step - 2) % p]
            if step == p - 2:
                torch.add(own, recv, out=op.shard)  # own is chunk r; shard may alias it
            else:
                send = recv.add_(own)

    def _ring_all_gather(self, op: _RingOp) -> None:
        """At step s rank r forwards chunk r-s to the right and receives chunk r-s-1 in place."""
        p, r = self.world_size, self.rank
        chunks = op.flat.chunk(p)
        if chunks[r].data_ptr() != op.shard.data_ptr():
            chunks[r].copy_(op.shard)
        for step in range(p - 1):
            deadline = time.monotonic() + self.timeout_s
            self._exchange(op, step, chunks[(r - step) % p], chunks[(r - step - 1) % p], deadline)
