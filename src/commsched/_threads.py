"""Threads the kernel can tell apart, so that per-thread CPU readings (``/proc/self/task``,
:mod:`commsched.bench.threads`, ``top -H``) separate the runtime's threads from the training thread.

Python 3.11 gives the kernel no name for the threads it starts (each shows the
interpreter's); :func:`kernel_named` wraps a thread's target so that the
thread names itself first (Linux ``prctl(PR_SET_NAME)``: 15 bytes at most,
``commsched-`` shortened to ``cs-``). Elsewhere, or where the call fails, the
name is simply not set.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable
from typing import Any

_PR_SET_NAME = 15
_KERNEL_NAME_BYTES = 15


def kernel_name(name: str) -> str:
    """The name the kernel is given for ``name``."""
    return name.replace("commsched-", "cs-")[:_KERNEL_NAME_BYTES]


def set_kernel_name(name: str) -> None:
    """Name the calling thread for the kernel (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, kernel_name(name).encode(), 0, 0, 0)


def kernel_named(target: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``target`` run by a thread that first names itself ``name`` for the kernel."""

    def run(*args: Any, **kwargs: Any) -> Any:
        set_kernel_name(name)
        return target(*args, **kwargs)

    return run
