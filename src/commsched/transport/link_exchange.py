"""A transport made of a :class:`~commsched.transport.exchange.PsExchange` over a link it owns."""

from __future__ import annotations

from typing import Generic, TypeVar

from commsched.schedule.base import CommTask
from commsched.transport.base import TaskBuffer
from commsched.transport.exchange import PsExchange
from commsched.transport.handles import Handle
from commsched.transport.links import Link

L = TypeVar("L", bound=Link)


class LinkExchange(Generic[L]):
    """A transport made of a :class:`PsExchange` over a link it owns (``"ps"``, DLCP's, the tails harness's).

    If the exchange cannot be built, the link is closed before the error
    propagates; :meth:`close` lets started tasks finish, then closes the link.
    """

    __slots__ = ("exchange", "link")

    def __init__(self, link: L, timeout_s: float, servers: tuple[int, ...] | None = None) -> None:
        self.link = link
        try:
            self.exchange = PsExchange(link, timeout_s, servers=servers)
        except BaseException:
            link.close()
            raise

    def start(self, task: CommTask, buffer: TaskBuffer) -> Handle:
        return self.exchange.start(task, buffer)

    def close(self) -> None:
        try:
            self.exchange.close()
        finally:
            self.link.close()
