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
do not walk: the modules, the model, the optimizer — what the process keeps
to its end. Later passes walk only what was made since. The price: an
object alive at that moment that later becomes garbage inside a reference
cycle is not freed (``gc.unfreeze()`` gives them back to the collector).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("commsched")

__all__ = ["freeze_long_lived"]


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
