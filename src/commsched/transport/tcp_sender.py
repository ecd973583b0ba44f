"""The sending side of one :class:`~commsched.transport.tcp.TcpLink` connection.

Frames go out whole and in the order they were sent. A frame sent while
nothing is queued before it is written by the calling thread, with one
non-blocking ``writev`` of its header and payload; what the socket does not
take at once, and every frame sent after it until the queue has drained,
the connection's sender thread writes, blocking (each chunk bounded by the
socket's timeout). A frame's transfer ends once its last byte is handed to
the socket.

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
from typing import TYPE_CHECKING

from commsched.errors import RuntimeCommError

if TYPE_CHECKING:
    from commsched.transport.tcp import TcpTransfer

__all__ = ["CHUNK_BYTES", "PeerSender"]

#: what the sender thread hands the socket at a time (the timeout bounds each)
CHUNK_BYTES = 1 << 20


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
        self._queue: queue.SimpleQueue[tuple[memoryview, memoryview, TcpTransfer] | None] = queue.SimpleQueue()

    def send(self, header: bytes, payload: memoryview, t: TcpTransfer) -> None:
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

    def _fail(self, t: TcpTransfer, why: str) -> None:
        t.finish(RuntimeCommError(f"{t.describe}: {why}"))
        self._on_fail(why)
