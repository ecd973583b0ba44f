"""What :meth:`~commsched.transport.exchange.PsExchange.start` returns: a started task of the parameter server.

A :class:`Chained` task: no thread waits for it; the link's thread that ends the last receive
of a phase finishes that phase (the owner's sum, the stale fill) and posts
the next (an ``all_reduce``'s pull); the task ends once its last phase is
finished and every send has ended, in the thread that saw the last of
those, where its ``then`` callbacks run. On a rank whose one core also
computes, each thread that wakes may preempt the training thread: under the
``ps`` policy on resnet5m the worker pool and the agent's watcher together
woke about 300 times per iteration on each rank, unshaped (BENCHMARKS.md,
"The parameter server's tasks ended by its link's threads"), where a worker
pool waited for each task before.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import torch

from commsched.errors import RuntimeCommError
from commsched.transport.handles import Ended
from commsched.transport.links import Transfer, TransferKey

__all__ = ["Chained", "Detachable", "Phase", "Posted", "task_error"]


@dataclass(slots=True)
class Posted:
    """One phase of a started task: its transfer key, the sends and receives it posted on the link."""

    key: TransferKey
    sends: list[Transfer]
    recvs: list[tuple[int, Transfer, int, torch.Tensor]]  # (peer, transfer, offset in flat, where it lands)


def task_error(describe: str, exc: BaseException) -> RuntimeCommError:
    """The error a task ``describe`` raises for what ended it: a transport's error prefixed with the task,
    anything else (a bug) named with its type."""
    if isinstance(exc, RuntimeCommError):
        return RuntimeCommError(f"{describe}: {exc}")
    return RuntimeCommError(f"{describe} failed: {exc!r}")


class Chained:
    """A started task that its transfers end (the module docstring): the thread that ends the last
    receive of a phase finishes that phase and posts the next; the task ends once its last phase is finished
    and every send of every phase has ended.

    A phase waits for its receives only: its sends go on behind it. Over DLCP's link a send ends when its
    receiver says Stop, a round trip after the last datagram reached it, and an ``all_reduce`` that waited for
    that before returning its sum left the link idle for that round trip at every partition's turn (a peer
    writes into the slices this rank's push still reads only after it has received all of that push, so
    nothing the sends read is overwritten while they need it).

    Nor does the task wait for that round trip at its end, where the caller waits for it: once its last phase,
    which received something, is finished, the sends still going on that can be detached (:class:`Detachable`:
    DLCP's, which then read a copy of what they still send, where the link's own thread ended that phase) are,
    and the task ends; a send that cannot be detached holds it until it ends, and a phase that only sends (a
    push to a parameter server) ends with its sends. A detached send that fails afterwards is reported to
    ``on_late_error``.

    ``phases``: per phase, a callable that posts its transfers and one that finishes it once its receives have
    all ended (raising what went wrong); ``on_end`` is called once the task has ended and no send of it goes
    on (at once if it failed).
    """

    __slots__ = (
        "_ended",
        "_error",
        "_finished",
        "_left",
        "_lock",
        "_on_end",
        "_on_late_error",
        "_over",
        "_phases",
        "_quiet",
        "_received",
        "_released",
        "_sending",
        "_sends",
        "deadline",
        "describe",
        "timeout_s",
    )

    def __init__(
        self,
        describe: str,
        phases: list[Phase],
        timeout_s: float,
        on_end: Callable[[Chained], None],
        on_late_error: Callable[[RuntimeCommError], None] | None = None,
    ) -> None:
        self.describe = describe
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._phases = deque(phases)
        self._on_end = on_end
        self._on_late_error = on_late_error
        self._ended = Ended()
        self._error: RuntimeCommError | None = None
        self._lock = threading.Lock()
        self._left = 0  # receives of the current phase not ended (+1 while their callbacks are registered)
        self._sending = 0  # sends of every phase not ended
        self._sends: list[Transfer] = []  # every send posted
        self._received = False  # the last phase posted receives
        self._finished = False  # the last phase is finished
        self._over = False  # the task has ended (or failed)
        self._released = False  # ``on_end`` was called: no send goes on
        self._quiet = threading.Event()  # set with it

    def advance(self) -> None:
        """Post the next phase (its transfers call back), or, after the last, end the task once its sends have
        ended or been detached (the class docstring)."""
        if self._over:
            return
        if not self._phases:
            with self._lock:
                self._finished = True
                over = not self._sending
            if over or (self._received and self._detach_sends()):
                self._end(None)
            return
        post, finish = self._phases.popleft()
        try:
            posted = post()
        except BaseException as exc:
            self._end(exc)
            return
        with self._lock:
            self._left = len(posted.recvs) + 1  # one more until every callback is registered
            self._sending += len(posted.sends)
            self._received = bool(posted.recvs)
        self._sends += posted.sends
        for send in posted.sends:
            if not send.then(functools.partial(self._sent, send)):
                self._sent(send)  # ended already
        for _, transfer, _, _ in posted.recvs:
            if not transfer.then(lambda: self._count(posted, finish)):
                self._count(posted, finish)  # ended already
        self._count(posted, finish)

    def _count(self, posted: Posted, finish: Callable[[Posted], None]) -> None:
        with self._lock:
            self._left -= 1
            if self._left or self._over:
                return
        try:
            finish(posted)
        except BaseException as exc:
            self._end(exc)
            return
        self.advance()

    def _detach_sends(self) -> bool:
        """Detach every send still going on; False if one cannot be (now)."""
        pending = [send for send in self._sends if not send.is_completed()]
        if not all(isinstance(send, Detachable) for send in pending):
            return False
        return all([cast(Detachable, send).detach() for send in pending])  # a list: try every one

    def _sent(self, send: Transfer) -> None:
        try:
            send.wait(0.0)  # ended: raises the send's error, if it failed
        except BaseException as exc:
            if self._over and self._error is None and self._on_late_error is not None:  # detached, then failed
                self._on_late_error(task_error(f"{self.describe} (a send that went on after the task ended)", exc))
                self._release()
            self._end(exc)
            return
        with self._lock:
            self._sending -= 1
            quiet = self._over and not self._sending  # the last detached send ended
            over = not self._over and self._finished and not self._sending
        if quiet:
            self._release()
        elif over:
            self._end(None)

    def _end(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            quiet = exc is not None or not self._sending
        if exc is not None:
            self._error = task_error(self.describe, exc)
        if quiet:
            self._release()
        self._ended.set()

    def _release(self) -> None:
        """The task has ended and no send of it goes on (or it failed): ``on_end``, once."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._on_end(self)
        self._quiet.set()

    def settle(self, timeout_s: float) -> bool:
        """Block until the task has ended and no send of it goes on, at most ``timeout_s``; whether it has."""
        return self._quiet.wait(timeout_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the task has ended, at most ``timeout_s`` (None: until the transport's timeout from its
        start has passed)."""
        limit = max(0.0, self.deadline - time.monotonic()) if timeout_s is None else timeout_s
        if not self._ended.wait(limit):
            if timeout_s is not None:
                raise RuntimeCommError(f"{self.describe} did not complete within {timeout_s:g} s")
            raise RuntimeCommError(f"{self.describe}: did not complete within timeout_s={self.timeout_s:g} of start")
        if self._error is not None:
            raise self._error

    def is_completed(self) -> bool:
        return self._ended.is_set()

    def then(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` in the thread that ends the task; False (and nothing registered) if it has ended."""
        return self._ended.then(fn)


@runtime_checkable
class Detachable(Protocol):
    """A send that can go on without its caller's tensor (DLCP's,
    :meth:`~commsched.transport.dlcp.link.DlcpTransfer.detach`)."""

    def detach(self) -> bool:
        """From now on read a copy of what is still to be sent, so that the caller may change its tensor; False if
        that cannot be done now (the send then still reads the caller's tensor until it ends)."""
        ...


#: One phase of a task: post its transfers; finish it once they have all ended.
Phase = tuple[Callable[[], Posted], Callable[[Posted], None]]
