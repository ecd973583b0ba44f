"""Log every full pass of the garbage collector of each Python process started with this folder on PYTHONPATH.

    GC_LOG_DIR=OUT PYTHONPATH=benchmarks/gc_log:src python benchmarks/dlcp_tails.py ...

Each process appends to ``OUT/log.<pid>`` (default ``/tmp/gcprobe``) one line per full (generation 2) pass:
``time.monotonic()`` at its end, its wall milliseconds, the objects it freed, and 0 (a column kept for the
format of the saved runs). ``benchmarks/dlcp_gc_ab.py`` sets the passes beside the rounds they stalled.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

_DIR = Path(os.environ.get("GC_LOG_DIR", "/tmp/gcprobe"))
_started: dict[str, float] = {}


def _log(phase: str, info: dict[str, Any]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _started["s"] = time.perf_counter()
        return
    ms = (time.perf_counter() - _started.get("s", time.perf_counter())) * 1e3
    _DIR.mkdir(parents=True, exist_ok=True)
    with open(_DIR / f"log.{os.getpid()}", "a") as f:
        f.write(f"{time.monotonic():.4f} {ms:.2f} {info['collected']} 0\n")


gc.callbacks.append(_log)
