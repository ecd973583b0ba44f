"""Simulations run with Python's cyclic garbage collector paused.

A simulation allocates objects by the million (packets, events, transport
state) and frees them by reference counting; the cyclic collector finds
almost nothing to free (a 16-host iteration run of
``benchmarks/dlcp_simulation.py`` left 0.35 M objects in cycles and the
same peak memory, 0.30 GB, with the collector off), but its full passes walk
every live object, and at scale they dominated: ``perf`` on the 144-host
DLCP iteration run found 64 % of its CPU in ``gc_collect_main`` and its
visitors, 14 % of DCTCP's. The collector is re-enabled when the simulation
ends, and its next pass frees what cycles were left.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the ``with`` block; re-enable it after if it was enabled."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
