"""Short full passes of Python's garbage collector in a process whose communication runs in Python threads.

A full (generation 2) pass of the cycle collector walks every object the
collector tracks, holding the GIL: every Python thread of the process stops
for it. A process that imported torch and commsched's transports tracks
about 170,000 objects, and one full pass took 85-95 ms on the development
machine (2 cores; ``python benchmarks/gc_pause.py``). Where the data path is a
Python thread (the DLCP link's I/O thread, the TCP link's receiving threads
of ``ps``), a pass stalls the transfers in flight as well as the training
thread, where gloo's C++ threads would carry on. On the testbed's
communication-only harness (DLCP collective mode, 2 senders, 300 Mbit/s,
1000 rounds) the two slowest rounds, 270-320 ms against a median of 138,
were the rounds in which both ranks ran a full pass (155 and 182 ms);
with the freeze, in two runs against two without, the passes took 12-31 ms
against 106-198 and the slowest rounds 173-221 ms against 261-350
(BENCHMARKS.md, "DLCP without the collector's full passes").

:func:`freeze_long_lived` runs one full pass, then moves every object alive
into the collector's permanent generation (``gc.freeze``), which later passes
do not walk: the modules, the model, the optimizer. Later passes walk only
what was made since. An object alive at that moment that becomes garbage
inside a reference cycle is not freed while it stays frozen, so a link
holds the freeze only while it is open (:func:`hold`): when the last link
that holds it closes, everything frozen goes back to the collector
(``gc.unfreeze``), and a job's engine, buffers and model, closed and
dropped, are freed as before — unless the process had frozen objects of its
own before the first hold, whose freeze is then left as it was.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("commsched")

__all__ = ["freeze_long_lived", "hold", "nothing_held"]

_lock = threading.Lock()
_holds = 0
_theirs = False  # the process had frozen objects before the first hold: never unfreeze them


def hold() -> Callable[[], None]:
    """:func:`freeze_long_lived`, counted; returns the release (once is enough; more calls do nothing). The last
    release of the holds open together gives the frozen objects back to the collector."""
    global _holds, _theirs
    with _lock:
        if _holds == 0:
            _theirs = gc.get_freeze_count() > 0
        freeze_long_lived()
        _holds += 1
    released = False

    def release() -> None:
        global _holds
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _holds -= 1
            if _holds == 0 and not _theirs:
                gc.unfreeze()

    return release


def nothing_held() -> None:
    """The release of a link that holds no freeze."""


def freeze_long_lived() -> None:
    """Collect once, then keep every object alive now out of the collector's later passes (module docstring)."""
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug(
        "commsched: %d objects moved out of the garbage collector's passes in %.1f ms",
        gc.get_freeze_count(),
        (time.perf_counter() - start) * 1e3,
    )
