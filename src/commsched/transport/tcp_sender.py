"""The sending side of one TCP connection: of a :class:`~commsched.transport.tcp.TcpLink` or of
:class:`~commsched.transport.direct.DirectCollectives`'s mesh.

Frames go out whole and in the order they were sent. A frame sent while
nothing is queued before it is written by the calling thread, with one
non-blocking ``writev`` of its header and payload; what the socket does not
take at once, and every frame sent after it until the queue has drained,
the connection's sender thread writes, blocking (each chunk bounded by the
socket's timeout). A frame ends (:meth:`Frame.finish`) once its last byte
is handed to the socket.

Why not always the sender thread: on a rank whose one core also computes,
every thread that wakes may preempt the training thread, and under the
``ps`` policy the sender thread woke for nearly every frame (about 100
times per iteration on resnet5m; BENCHMARKS.md, "The parameter server's
tasks ended by its link's threads").
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from commsched.errors import RuntimeCommError

__all__ = ["CHUNK_BYTES", "Frame", "PeerSender"]

#: what the sender thread hands the socket at a time (the timeout bounds each)
CHUNK_BYTES = 1 << 20


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

    __slots__ = ("_lock", "_on_fail", "_queue", "_queued", "_sock", "peer")

    def __init__(self, peer: int, sock: socket.socket, on_fail: Callable[[str], None]) -> None:
        self.peer = peer
        self._sock = sock
        self._on_fail = on_fail
        self._lock = threading.Lock()
        self._queued = 0  # frames queued for the thread or being written by it
        self._queue: queue.SimpleQueue[tuple[memoryview, memoryview, Frame] | None] = queue.SimpleQueue()

    def send(self, header: bytes, payload: memoryview, t: Frame) -> None:
        """Write the frame ``header + payload`` (the payload is read until ``t`` ends); never blocks.

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
                self._queued += 1
                self._queue.put((head[sent:], body[max(0, sent - len(head)) :], t))
        if failed is not None:
            self._fail(t, failed)
        elif whole:
            t.finish()

    def stop(self) -> None:
        self._queue.put(None)

    def run(self) -> None:
        while (item := self._queue.get()) is not None:
            head, body, t = item
            try:
                self._sock.sendall(head)
                for start in range(0, len(body), CHUNK_BYTES):
                    self._sock.sendall(body[start : start + CHUNK_BYTES])
            except OSError as exc:
                why = f"the connection to rank {self.peer} failed ({exc})"
                self._fail(t, why)
                while (rest := self._queue.get()) is not None:
                    rest[2].finish(RuntimeCommError(f"{rest[2].describe}: {why}"))
                return
            with self._lock:
                self._queued -= 1
            t.finish()

    def _fail(self, t: Frame, why: str) -> None:
        self._on_fail(why)  # first: whoever waits for ``t`` then finds the connection failed
        t.finish(RuntimeCommError(f"{t.describe}: {why}"))
