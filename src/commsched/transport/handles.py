"""What an issued collective returns: a :class:`Handle` to wait on, and its three kinds.

:class:`DoneHandle` for an op that finished or failed at issue,
:class:`WorkHandle` for an op the backend runs itself (a ``dist.Work``), and
:class:`RingHandle` for a ring op queued on the worker thread of
:mod:`commsched.transport.ring`. Every failure surfaces from ``wait()`` as
:class:`~commsched.errors.RuntimeCommError` naming the op.

A handle (or a link's transfer) whose op is ended by a thread of its
transport may also offer ``then(fn) -> bool`` (:class:`Ended`): ``fn`` is
called in the thread that ends the op, so that nobody has to wait for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from commsched.errors import RuntimeCommError

__all__ = ["DoneHandle", "Ended", "Handle", "RingHandle", "WorkHandle"]

# How often a waiting caller checks that the ring worker is still alive.
_POLL_S = 0.5


class Handle(Protocol):
    """A pending collective."""

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the op is done (on NCCL: until the current stream is ordered after it).

        Raises :class:`RuntimeCommError` naming the op if it failed or did not finish
        within ``timeout_s`` (``None``: the group's timeout bounds it).
        """
        ...

    def is_completed(self) -> bool:
        """True once the op finished, successfully or not; never blocks."""
        ...


class Ended:
    """That an op has ended, to wait for or to be called back at: a ``threading.Event`` with callbacks.

    :meth:`then` registers ``fn`` to run once, in the thread that calls
    :meth:`set` (the first call counts), and returns True; where the op has
    ended already it registers nothing and returns False, so that the caller,
    who may hold locks ``fn`` takes, decides where to run it. ``fn`` must not
    raise: it runs in a transport's own thread, which has nobody to tell.
    """

    __slots__ = ("_callbacks", "_event", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._event.wait(timeout_s)

    def then(self, fn: Callable[[], None]) -> bool:
        with self._lock:
            if self._event.is_set():
                return False
            self._callbacks.append(fn)
            return True

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()


class DoneHandle:
    """An op that finished at issue (world size 1, empty buffers) or failed at issue."""

    __slots__ = ("_error",)

    def __init__(self, error: RuntimeCommError | None = None) -> None:
        self._error = error

    def wait(self, timeout_s: float | None = None) -> None:
        if self._error is not None:
            raise self._error

    def is_completed(self) -> bool:
        return True


class WorkHandle:
    """An op the backend runs itself, wrapping its ``dist.Work``.

    gloo's ``reduce_scatter_tensor`` Work never reports ``is_completed()`` (torch 2.13), so
    a successful ``wait()`` is remembered here.
    """

    __slots__ = ("_describe", "_waited", "_work")

    def __init__(self, work: dist.Work, describe: str) -> None:
        self._work = work
        self._describe = describe
        self._waited = False

    def wait(self, timeout_s: float | None = None) -> None:
        try:
            if timeout_s is None:
                self._work.wait()
            else:
                self._work.wait(timedelta(seconds=max(timeout_s, 0.001)))
        except Exception as exc:
            raise RuntimeCommError(f"{self._describe} failed: {exc}") from exc
        self._waited = True

    def is_completed(self) -> bool:
        return self._waited or bool(self._work.is_completed())


class RingHandle:
    """A ring op queued on the worker thread; ``done`` is set when it finished or failed.

    ``started_s``: ``time.perf_counter()`` when the worker thread began it (None while queued).
    """

    __slots__ = ("_error", "_worker", "describe", "done", "started_s")

    def __init__(self, describe: str, worker: threading.Thread) -> None:
        self.describe = describe
        self.started_s: float | None = None
        self.done = threading.Event()
        self._error: RuntimeCommError | None = None
        self._worker = worker

    def finish(self, error: RuntimeCommError | None = None) -> None:
        self._error = error
        self.done.set()

    def wait(self, timeout_s: float | None = None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done.is_set():
            if not self._worker.is_alive():
                raise RuntimeCommError(f"{self.describe}: the ring worker thread stopped before running it")
            slice_s = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if slice_s <= 0:
                raise RuntimeCommError(f"{self.describe} did not complete within {timeout_s:g} s")
            self.done.wait(slice_s)
        if self._error is not None:
            raise self._error

    def is_completed(self) -> bool:
        return self.done.is_set()
