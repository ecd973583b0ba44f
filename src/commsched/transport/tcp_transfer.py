"""A send or receive of :class:`~commsched.transport.tcp.TcpLink`: what its callers wait on or chain to."""

from __future__ import annotations

from collections.abc import Callable

from commsched.errors import RuntimeCommError
from commsched.transport.handles import Ended
from commsched.transport.links import COMPLETE, Received

__all__ = ["TcpTransfer"]


class TcpTransfer:
    """A send or receive of :class:`TcpLink`; :meth:`then` calls back in the link's thread that ends it."""

    __slots__ = ("_done", "_error", "_timeout_s", "describe")

    def __init__(self, describe: str, timeout_s: float) -> None:
        self.describe = describe
        self._timeout_s = timeout_s
        self._done = Ended()
        self._error: RuntimeCommError | None = None

    def finish(self, error: RuntimeCommError | None = None) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def then(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` in the thread that ends the transfer; False (and nothing registered) if it has ended."""
        return self._done.then(fn)

    def wait(self, timeout_s: float | None = None) -> Received:
        limit = self._timeout_s if timeout_s is None else timeout_s
        if not self._done.wait(limit):
            raise RuntimeCommError(f"{self.describe} did not complete within {limit:g} s")
        if self._error is not None:
            raise self._error
        return COMPLETE  # TCP loses nothing

    def is_completed(self) -> bool:
        return self._done.is_set()

    def settle(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s``; whether the transfer has ended (done or failed: ``wait()`` tells)."""
        return self._done.wait(timeout_s)
