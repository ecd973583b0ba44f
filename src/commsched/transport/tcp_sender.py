"""The sending side of one TCP connection: of a :class:`~commsched.transport.tcp.TcpLink` or of
:class:`~commsched.transport.direct.DirectAllReduce`'s mesh.

Frames go out whole. A frame sent while nothing is queued before it is
written by the calling thread, with one non-blocking ``writev`` of its
header and payload; what the socket does not take at once, and every frame
sent after it until the queue has drained, the connection's sender thread
writes, blocking (each chunk bounded by the socket's timeout). Queued
frames go out by their ``order`` (lowest first; a link's ``(step, phase)``:
a step's pushes before its pulls, and no frame before one of an earlier
step), in the order they were sent among equals; a frame once started is
finished first. A frame ends
(:meth:`Frame.finish`) once its last byte is handed to the socket.

Why not always the sender thread: on a rank whose one core also computes,
every thread that wakes may preempt the training thread, and under the
``ps`` policy the sender thread woke for nearly every frame (about 100
times per iteration on resnet5m; BENCHMARKS.md, "The parameter server's
tasks ended by its link's threads").
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from commsched.errors import RuntimeCommError

__all__ = ["CHUNK_BYTES", "Frame", "PeerSender"]

#: what the sender thread hands the socket at a time (the timeout bounds each)
CHUNK_BYTES = 1 << 20
_STARTED, _QUEUED, _STOP = 0, 1, 2  # a queued frame's state: what goes first


class Frame(Protocol):
    """What a frame sent reports to: a transfer of a link, a direct all-reduce's op."""

    @property
    def describe(self) -> str: ...

    def finish(self, error: RuntimeCommError | None = None) -> None:
        """Written whole (``error`` None), or the connection failed first."""


class PeerSender:
    """Writes frames to ``peer`` over ``sock`` (module docstring); ``on_fail(why)`` when the connection fails.

    :meth:`run` is the sender thread's loop (the caller starts the thread);
    :meth:`stop` lets it write what is queued, then end.
    """

    __slots__ = ("_count", "_lock", "_on_fail", "_queue", "_queued", "_ready", "_sock", "peer")

    def __init__(self, peer: int, sock: socket.socket, on_fail: Callable[[str], None]) -> None:
        self.peer = peer
        self._sock = sock
        self._on_fail = on_fail
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queued = 0  # frames queued for the thread or being written by it
        self._count = itertools.count()  # the order frames were sent in, among equal orders
        # (0: started, 1: queued, 2: stop; order; count; head; body; frame), least first; the frame None: stop once
        # everything before it is written
        self._queue: list[tuple[int, tuple[int, ...], int, memoryview, memoryview, Frame | None]] = []

    def send(self, header: bytes, payload: memoryview, t: Frame, order: tuple[int, ...] = ()) -> None:
        """Write the frame ``header + payload`` (the payload is read until ``t`` ends); never blocks. Behind
        queued frames it goes out by ``order`` (lowest first), then as sent.

        ``t`` ends here where the socket took the whole frame (or failed), else in the sender thread; outside
        the lock either way, so that its callbacks may send again.
        """
        head, body = memoryview(header), payload
        with self._lock:
            sent, failed = 0, None
            if not self._queued:
                try:
                    sent = os.writev(self._sock.fileno(), [head, body])  # the socket is non-blocking
                except BlockingIOError:
                    pass
                except OSError as exc:
                    failed = f"the connection to rank {self.peer} failed ({exc})"
            whole = sent == len(head) + len(body)
            if failed is None and not whole:
                # a frame partly written here is the connection's next bytes, whatever its order
                self._put(_STARTED if sent else _QUEUED, order, head[sent:], body[max(0, sent - len(head)) :], t)
        if failed is not None:
            self._fail(t, failed)
        elif whole:
            t.finish()

    def stop(self) -> None:
        """Let the thread write what is queued, then end."""
        with self._lock:
            self._put(_STOP, (), memoryview(b""), memoryview(b""), None)

    def _put(self, state: int, order: tuple[int, ...], head: memoryview, body: memoryview, t: Frame | None) -> None:
        if t is not None:
            self._queued += 1
        heapq.heappush(self._queue, (state, order, next(self._count), head, body, t))
        self._ready.notify()

    def _next(self) -> tuple[memoryview, memoryview, Frame | None]:
        with self._lock:
            while not self._queue:
                self._ready.wait()
            _, _, _, head, body, t = heapq.heappop(self._queue)
            return head, body, t

    def run(self) -> None:
        while True:
            head, body, t = self._next()
            if t is None:
                return
            try:
                self._sock.sendall(head)
                for start in range(0, len(body), CHUNK_BYTES):
                    self._sock.sendall(body[start : start + CHUNK_BYTES])
            except OSError as exc:
                why = f"the connection to rank {self.peer} failed ({exc})"
                self._fail(t, why)
                while (rest := self._next()[2]) is not None:
                    rest.finish(RuntimeCommError(f"{rest.describe}: {why}"))
                return
            with self._lock:
                self._queued -= 1
            t.finish()

    def _fail(self, t: Frame, why: str) -> None:
        self._on_fail(why)  # first: whoever waits for ``t`` then finds the connection failed
        t.finish(RuntimeCommError(f"{t.describe}: {why}"))
