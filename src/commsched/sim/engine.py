"""A minimal discrete-event loop: a heap of ``(time, priority, sequence, callback, args)``.

The shape is SimPy's core without processes: :meth:`EventLoop.schedule` puts a
callback on the heap, :meth:`EventLoop.step` pops the earliest one, advances
:attr:`EventLoop.now` and calls it, :meth:`EventLoop.run` steps until the heap is
empty or a time limit is reached. Ties are broken by ``priority`` (smaller
first), then by insertion order, so a run is fully deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

#: Priority of compute events (gradients ready, layers done): at equal times they run first.
COMPUTE = 0
#: Priority of communication events (latency over, transfer done).
COMM = 1

_Entry = tuple[float, int, int, Callable[..., None], tuple[Any, ...]]


class EventLoop:
    """Virtual time in seconds, starting at 0.

    Guarantees: callbacks run in non-decreasing time order; at equal times in
    increasing ``priority``, then in the order they were scheduled. A callback
    may schedule further callbacks, at ``now`` or later, never earlier.
    """

    __slots__ = ("_heap", "_seq", "now", "processed")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = 0
        self.now = 0.0
        #: Number of callbacks run so far (the "events" of a simulation).
        self.processed = 0

    def schedule(self, time_s: float, callback: Callable[..., None], *args: Any, priority: int = COMPUTE) -> None:
        """Run ``callback(*args)`` at absolute time ``time_s``.

        A time a rounding error earlier than ``now`` is clamped to ``now``; a
        time clearly in the past is a bug and raises ValueError.
        """
        if time_s < self.now:
            if self.now - time_s > 1e-9 * max(1.0, abs(self.now)):
                raise ValueError(f"cannot schedule at {time_s!r} s, the clock is already at {self.now!r} s")
            time_s = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time_s, priority, self._seq, callback, args))

    def peek(self) -> float:
        """Time of the next event, ``inf`` when there is none."""
        return self._heap[0][0] if self._heap else float("inf")

    def step(self) -> None:
        """Run the earliest event. Raises IndexError when the heap is empty."""
        time_s, _, _, callback, args = heapq.heappop(self._heap)
        self.now = time_s
        self.processed += 1
        callback(*args)

    def run(self, until: float | None = None) -> None:
        """Step until no event is left (``until=None``) or the next one is later than ``until``.

        With a number, the clock is left at ``until`` (if it got that far), so a
        later ``run`` continues from there; events at exactly ``until`` do run.
        """
        heap = self._heap
        pop = heapq.heappop
        if until is None:
            while heap:
                time_s, _, _, callback, args = pop(heap)
                self.now = time_s
                self.processed += 1
                callback(*args)
            return
        while heap and heap[0][0] <= until:
            time_s, _, _, callback, args = pop(heap)
            self.now = time_s
            self.processed += 1
            callback(*args)
        self.now = max(self.now, until)
