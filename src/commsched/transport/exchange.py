"""The parameter server's data flow over any :class:`~commsched.transport.links.Link`.

A server runs on every rank (colocated, as in BytePS on a cluster without
spare CPU machines), and each task's flat buffer is sharded over the ranks:
rank ``r`` owns slice ``r`` (:func:`owner_slices`: an even split, the first
``numel mod p`` slices one element longer; ``servers=`` picks fewer owners,
e.g. one server on rank 0)::

    push   rank r sends slice q of its buffer to owner q (its own slice stays local);
           owner q receives the peers' slices (in parallel, any order) and adds them,
           in rank order, to its own slice of its buffer, where the sum then lies
    pull   owner q sends the sum to every peer; every rank receives each owner's
           slice into its buffer

**Contract** (what the runtime relies on): after a task's ``pull`` (or an
``all_reduce``, which is both) has completed, ``flat`` holds the element-wise
SUM over all ranks of the ``flat`` each rank pushed; between a push and its
pull, the owner's slice of the push's ``flat`` holds the sum (the pull
sends it from there, and copies it first where the pull is given another
buffer: the push's must not be written in between). A ``reduce_scatter``
is a push whose sum lands in ``buffer.shard``; an ``all_gather`` is a pull of
``buffer.shard`` (their buffers are padded to a multiple of the world size,
so the slices are the equal chunks a collective would use). Each element is
summed once, by its owner, so every rank receives the same sum. A push reads
``flat`` until it completes; a pull writes into it.

Ordering: every rank must start the same tasks in the same order (the
dispatcher guarantees it). A task's ``n``-th start is its step ``n``, and the
transfers are keyed by ``TransferKey(step, task, phase)``, so any number of
tasks, phases and iterations may be in flight. A push and its pull share the
push task's server state (a pull names its push in ``task.deps``); the runtime
starts a pull only after its push completed.

Threads: ``start`` posts every send and receive it can on the link and
returns at once. No thread waits for them: every transfer calls back when
it ends (``Transfer.then``), and the link's thread that ends a phase's last
receive does the arithmetic there (an ``all_reduce`` posts its pull there,
once its sum exists) and ends the task, whose handle calls back in turn
(:mod:`commsched.transport.exchange_tasks`).
A link that may write a frame before its receive is posted (the ``ps``
transport's :class:`~commsched.transport.tcp.TcpLink`) asks
:meth:`PsExchange.landing` where it will be posted, so that it arrives in
place instead of into a buffer copied out of later (on the rank that follows
the leader, nearly every frame arrives first: ``ps`` on resnet5m, 2 workers,
about 9 MB per iteration were copied so).
The returned handle's ``wait(timeout_s)`` raises
:class:`~commsched.errors.RuntimeCommError` naming the task on a failure or
after the timeout; ``is_completed()`` never blocks.

Bounded loss (a link that may give up on part of a receive, never more than
the ``loss_bound`` it was given; exceeding it is a RuntimeCommError):

* push: ``task.loss_bound``; the missing ranges of a peer's contribution count
  as zeros. With ``rescale_lost``, each element of the sum is then multiplied by
  ``p / (contributions that arrived)``: unbiased only when what is lost does
  not depend on the values (random loss), and still zero-filled otherwise.
* pull: ``pull_loss_bound`` (default 0), or a ``pull`` task's own ``loss_bound``
  where that is larger; the missing ranges keep the previous
  sum this rank received for the task (stale fill; zeros before the first).
* :attr:`PsExchange.losses` records, per ``(task, phase)``, what the latest
  launch lost on this rank, so a caller can check the bounds;
  :attr:`PsExchange.records` keeps every launch's :class:`Loss` (the latest
  65,536) until a caller takes them.

Memory per task on its owner: ``p - 1`` receive slices for the peers'
pushes (``1/p`` of the buffer each; one more on ranks 2 and above, for the
sum in rank order); with ``pull_loss_bound > 0`` also the
previous sum (the whole buffer), for stale fill. The sum needs none: it is
added up in the owner's own slice, where a separate accumulator cost a copy
of the slice per pull (``own.copy_(acc)``, about 1.3 ms per iteration of one
rank's receiving thread under ``ps`` on resnet5m, 2 workers, by ``perf``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from commsched.errors import RuntimeCommError, UnsupportedError
from commsched.schedule.base import CommTask
from commsched.transport.base import TaskBuffer
from commsched.transport.exchange_state import PULL, PUSH, Loss, ServerState
from commsched.transport.exchange_tasks import Chained, Phase, Posted
from commsched.transport.handles import Handle
from commsched.transport.links import Link, Received, TransferKey
from commsched.transport.slices import owner_slices

_PUSHING = ("push", "reduce_scatter", "all_reduce")
_PULLING = ("pull", "all_gather", "all_reduce")
__all__ = ["PULL", "PUSH", "Loss", "PsExchange", "owner_slices"]


class PsExchange:
    """Push/pull of tasks over ``link`` (module docstring); one per transport, every rank alike.

    ``timeout_s`` bounds each started task, from its start. ``pull_loss_bound``:
    the fraction of a pull's received elements the link may give up on;
    ``rescale_lost``: scale pushed sums by ``p / contributions`` where
    contributions were lost. ``servers``: the ranks that own slices, in order
    (default every rank; ``(0,)``: one server, every push into rank 0);
    reduce-scatter and all-gather need every rank.
    """

    def __init__(
        self,
        link: Link,
        timeout_s: float,
        *,
        pull_loss_bound: float = 0.0,
        rescale_lost: bool = False,
        servers: Sequence[int] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not 0 <= pull_loss_bound < 1:
            raise ValueError(f"pull_loss_bound must be in [0, 1), got {pull_loss_bound}")
        if servers is not None and (not servers or len(set(servers)) != len(servers)):
            raise ValueError(f"servers must be distinct ranks, at least one, got {servers}")
        if servers is not None and not all(0 <= r < link.world for r in servers):
            raise ValueError(f"servers must be ranks below the world size {link.world}, got {servers}")
        self.link = link
        self.rank, self.world = link.rank, link.world
        self.timeout_s = timeout_s
        self.pull_loss_bound = pull_loss_bound
        self.rescale_lost = rescale_lost
        self.servers = tuple(servers) if servers is not None else None
        #: per ``(task id, phase)``: what its latest launch lost on this rank
        self.losses: dict[tuple[int, int], Loss] = {}
        #: every launch's losses, oldest first (bounded); a caller drains it with ``popleft``
        self.records: deque[Loss] = deque(maxlen=1 << 16)
        self._launches: dict[int, int] = {}
        self._servers: dict[int, ServerState] = {}
        self._pulls: dict[int, int] = {}  # a pull or all-gather task -> its push's task, once it has started
        self._chains: set[Chained] = set()  # started and not ended (close waits for them)
        self._chains_lock = threading.Lock()
        self._closed = False
        #: a send that went on after its task ended (detached, :class:`Chained`) and then failed: every later
        #: start raises it
        self._failed_late: RuntimeCommError | None = None

    # ---- starting ----

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        """Post ``task``'s transfers and return at once; the result is in ``buffer`` after ``wait()``."""
        step = self._launches.get(task.id, 0)
        describe = f"ps {task.kind} of task {task.name!r} (step {step}) on rank {self.rank}"
        if self._closed:
            raise RuntimeCommError(f"{describe}: the transport is closed")
        if self._failed_late is not None:
            raise RuntimeCommError(f"{describe}: an earlier task failed: {self._failed_late}")
        flat = buffer.flat
        if flat.device.type != "cpu" or not flat.is_contiguous():
            raise UnsupportedError(f"{describe}: needs a contiguous CPU buffer, got {flat.device} {flat.stride()}")
        flat = flat.view(-1)
        owner = task.deps[0] if task.kind in ("pull", "all_gather") and task.deps else task.id
        server = self._server(owner, flat)
        shard = buffer.shard.view(-1) if buffer.shard is not None else None
        lo, hi = server.slices[self.rank]
        # target: where a push's sum lands, where a pull sends this rank's slice from
        if task.kind in ("reduce_scatter", "all_gather"):
            if shard is None or shard.numel() != hi - lo:
                raise UnsupportedError(f"{describe}: needs a shard of {hi - lo} elements, got {shard}")
            target = shard
        elif task.kind not in ("push", "pull", "all_reduce"):
            raise UnsupportedError(f"{describe}: unknown task kind")
        elif task.kind == "pull":
            if server.flat is None or server.summed < 0:
                raise UnsupportedError(f"{describe}: its push (task {owner}) has not run on this rank")
            target = server.flat[lo:hi]  # where its push's sum lies
        else:
            target = flat[lo:hi]
        if task.kind in _PUSHING:  # first: :meth:`landing` must not see the next step before the inboxes are taken
            server.pushing, server.flat = True, flat
        elif owner != task.id:
            self._pulls[task.id] = owner
        self._launches[task.id] = step + 1
        phases: list[Phase] = []
        if task.kind in _PUSHING:  # posted here, at the start: every rank posts its pushes in start order
            pushed = self._post_push(task, step, flat, server)
            phases.append((lambda: pushed, lambda p: self._finish_push(task, p, flat, server, target)))
        if task.kind == "all_reduce":
            phases.append((lambda: self._post_pull(task, step, flat, server, target),
                           lambda p: self._finish_pull(task, p, flat, server)))  # fmt: skip
        elif task.kind in _PULLING:
            pulled = self._post_pull(task, step, flat, server, target)
            phases.append((lambda: pulled, lambda p: self._finish_pull(task, p, flat, server)))
        chain = Chained(describe, phases, self.timeout_s, self._chain_ended, self._late_error)
        with self._chains_lock:
            self._chains.add(chain)
        chain.advance()
        return chain

    def _late_error(self, error: RuntimeCommError) -> None:
        if self._failed_late is None and not self._closed:
            self._failed_late = error

    def _chain_ended(self, chain: Chained) -> None:
        with self._chains_lock:
            self._chains.discard(chain)

    def _server(self, owner: int, flat: torch.Tensor) -> ServerState:
        server = self._servers.get(owner)
        if server is None or server.numel != flat.numel() or server.dtype != flat.dtype:
            keep = self.pull_loss_bound > 0
            server = ServerState(flat.numel(), flat.dtype, self.rank, self.world, self.servers, keep)
            self._servers[owner] = server
        return server

    def landing(self, peer: int, key: TransferKey, dtype: torch.dtype, numel: int) -> torch.Tensor | None:
        """Where a link may write ``peer``'s frame of ``key`` before this rank posts its receive, so that it
        arrives in place instead of into a buffer to copy out of (None: nowhere yet).
        :attr:`commsched.transport.tcp.TcpLink.landing` takes it.

        * The push this rank starts next of a task it started before, once its previous push has made its sum:
          the inbox its receive will be posted with.
        * The pull this rank starts next of a pair whose pull it started before, once the push of the same step
          has made its sum here: ``peer``'s slice of that push's buffer, where the pull will be posted if it is
          given the same buffer (as the runtime's pairs are; otherwise the pull copies it from there). This
          rank's push no longer reads that slice: over a reliable link, ``peer`` sends its sum only after it
          received all of this rank's push, which this rank wrote before.
        """
        if key.phase == PUSH:
            server = self._servers.get(key.task)
            if server is None or server.pushing or self._launches.get(key.task) != key.step:
                return None
            out = server.inbox.get(peer)
        else:
            owner = self._pulls.get(key.task)
            server = None if owner is None else self._servers.get(owner)
            if server is None or server.flat is None or server.summed != key.step:
                return None
            if self._launches.get(key.task) != key.step:
                return None
            a, b = server.slices[peer]
            out = server.flat[a:b]
        return out if out is not None and out.dtype == dtype and out.numel() == numel else None

    def _post_push(self, task: CommTask, step: int, flat: torch.Tensor, server: ServerState) -> Posted:
        key = TransferKey(step, task.id, PUSH)
        lo, hi = server.slices[self.rank]
        sends = [
            self.link.send(q, key, flat[a:b], priority=task.priority, loss_bound=task.loss_bound)
            for q, (a, b) in enumerate(server.slices)
            if q != self.rank and b > a
        ]
        recvs = []
        if hi > lo:
            for q, box in server.inbox.items():
                recvs.append((q, self.link.recv(q, key, box, loss_bound=task.loss_bound), lo, box))
        return Posted(key, sends, recvs)

    def _post_pull(
        self, task: CommTask, step: int, flat: torch.Tensor, server: ServerState, source: torch.Tensor
    ) -> Posted:
        key = TransferKey(step, task.id, PULL)
        lo, hi = server.slices[self.rank]
        own = flat[lo:hi]
        if own.data_ptr() != source.data_ptr():
            own.copy_(source)
        bound = self._pull_bound(task)
        sends = [self.link.send(q, key, own, priority=task.priority, loss_bound=bound) for q in server.inbox if hi > lo]
        recvs = []
        for q, (a, b) in enumerate(server.slices):
            if q != self.rank and b > a:
                recvs.append((q, self.link.recv(q, key, flat[a:b], loss_bound=bound), a, flat[a:b]))
        return Posted(key, sends, recvs)

    # ---- finishing (in the link's thread that ended a phase's last receive) ----

    def _wait_all(self, posted: Posted, bound: float) -> list[Received]:
        """The results of ``posted``'s receives, which have all ended (raising a failure); each checked against
        ``bound`` (its sends may still be under way: :class:`Chained` waits for them)."""
        out = []
        for peer, transfer, _, box in posted.recvs:
            received = transfer.wait(0.0)
            if received.lost > bound * box.numel():
                raise RuntimeCommError(
                    f"rank {peer} delivered {box.numel() - received.lost} of {box.numel()} elements of "
                    f"{posted.key}: lost {received.lost}, above the bound {bound:g}"
                )
            out.append(received)
        return out

    def _finish_push(
        self,
        task: CommTask,
        posted: Posted,
        flat: torch.Tensor,
        server: ServerState,
        target: torch.Tensor,
    ) -> None:
        received = self._wait_all(posted, task.loss_bound)
        lo, hi = server.slices[self.rank]
        counts: torch.Tensor | None = None
        for (_, _, _, box), got in zip(posted.recvs, received, strict=True):
            for a, b in got.missing:
                box[a:b].zero_()
                if self.rescale_lost:
                    if counts is None:
                        counts = torch.full((hi - lo,), float(self.world), dtype=torch.float64)
                    counts[a:b] -= 1
        own = flat[lo:hi]
        if target.data_ptr() == own.data_ptr():
            server.sum_in_place(own, self.rank, self.world)
        else:
            contributions = [own if q == self.rank else server.inbox[q] for q in range(self.world)]
            # the first two summed in one pass, not copied and then added (the same additions in the same order;
            # a 4 MiB shard on one core of the development machine: 626 -> 470 us)
            if len(contributions) > 1:
                torch.add(contributions[0], contributions[1], out=target)
            else:
                target.copy_(contributions[0])
            for part in contributions[2:]:
                target.add_(part)
        if counts is not None:
            target.copy_((target.double() * (self.world / counts)).to(target.dtype))
        server.summed = posted.key.step
        server.pushing = False  # its inboxes are free: the next push's frames may land in them
        self._record(task.id, PUSH, posted.key.step, received, posted, task.loss_bound)

    def _finish_pull(self, task: CommTask, posted: Posted, flat: torch.Tensor, server: ServerState) -> None:
        bound = self._pull_bound(task)
        received = self._wait_all(posted, bound)
        if bound > 0 and server.previous is None:  # from now on keep the sums for stale fill (zeros before)
            server.previous = torch.zeros_like(flat)
        previous = server.previous
        for (_, _, offset, box), got in zip(posted.recvs, received, strict=True):
            for a, b in got.missing:
                assert previous is not None  # kept whenever the bound lets anything be lost
                box[a:b].copy_(previous[offset + a : offset + b])
        if previous is not None:
            previous.copy_(flat)
        self._record(task.id, PULL, posted.key.step, received, posted, bound)

    def _pull_bound(self, task: CommTask) -> float:
        """The larger of ``pull_loss_bound`` and, for a ``pull`` task, the task's own ``loss_bound``."""
        return max(self.pull_loss_bound, task.loss_bound if task.kind == "pull" else 0.0)

    def _record(self, task: int, phase: int, step: int, received: list[Received], posted: Posted, bound: float) -> None:
        lost = sum(r.lost for r in received)
        missing = tuple(
            (offset + a, offset + b)
            for (_, _, offset, _), got in zip(posted.recvs, received, strict=True)
            for a, b in got.missing
        )
        loss = Loss(step, lost, sum(box.numel() for *_, box in posted.recvs), task, phase, missing, bound)
        self.losses[(task, phase)] = loss
        self.records.append(loss)

    def launches(self) -> dict[int, int]:
        """Per task id: how many times it was started (its next launch's ``step``)."""
        return dict(self._launches)

    # ---- closing ----

    def close(self) -> None:
        """Let started tasks finish (each bounded by ``timeout_s`` from its start)."""
        if not self._closed:
            self._closed = True
            with self._chains_lock:
                chains = list(self._chains)
            for chain in chains:
                with contextlib.suppress(RuntimeCommError):
                    chain.wait(max(0.0, chain.deadline - time.monotonic()))
                # a send that went on after its task ended (detached) still re-sends what its receiver lacks
                chain.settle(max(0.0, chain.deadline - time.monotonic()))
