"""Started and completed task instances, shared between the threads of one rank's
:class:`~commsched.runtime.agent.Agent`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from commsched.errors import RuntimeCommError
from commsched.transport import Handle


@dataclass(frozen=True)
class Started:
    """A task instance started on its transport under the plan of ``epoch``, at ``start_s`` (``perf_counter``)."""

    task: int
    instance: int
    epoch: int
    handle: Handle
    start_s: float


class Completions:
    """Completed task instances of the current plan, shared between threads, and the first error."""

    __slots__ = ("_cond", "_done", "_epoch", "error")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._done: list[int] = []
        self._epoch = -1
        self.error: BaseException | None = None

    def reset(self, num_tasks: int, epoch: int) -> None:
        with self._cond:
            self._done = [0] * num_tasks
            self._epoch = epoch

    def mark(self, task: int, instance: int, epoch: int) -> None:
        with self._cond:
            if epoch == self._epoch:
                self._done[task] = max(self._done[task], instance + 1)
                self._cond.notify_all()

    def done(self, task: int, instance: int) -> bool:
        return self._done[task] > instance

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()

    def wait(self, task: int, instance: int, timeout_s: float, describe: Callable[[], str]) -> None:
        """Block until ``task`` of ``instance`` has completed; raise on a failure or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._done[task] <= instance:
                self.raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeCommError(
                        f"{describe()} did not finish within {timeout_s:.0f} s; a peer may have crashed or hung"
                    )
                self._cond.wait(timeout=min(left, 1.0))
            self.raise_if_failed()

    def raise_if_failed(self) -> None:
        err = self.error
        if err is not None:
            if isinstance(err, RuntimeCommError):
                raise RuntimeCommError(f"communication failed: {err}") from err
            raise RuntimeCommError(f"communication thread failed: {err!r}") from err
