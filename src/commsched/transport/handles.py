"""What an issued collective returns: a :class:`Handle` to wait on, and its three kinds.

:class:`DoneHandle` for an op that finished or failed at issue,
:class:`WorkHandle` for an op the backend runs itself (a ``dist.Work``), and
:class:`RingHandle` for a ring op queued on the worker thread of
:mod:`commsched.transport.ring`. Every failure surfaces from ``wait()`` as
:class:`~commsched.errors.RuntimeCommError` naming the op.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from commsched.errors import RuntimeCommError

__all__ = ["DoneHandle", "Handle", "RingHandle", "WorkHandle"]

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
