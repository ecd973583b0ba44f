"""Threads the kernel can tell apart, so that per-thread CPU readings (``/proc/self/task``,
:mod:`commsched.bench.threads`, ``top -H``) separate the runtime's threads from the training thread.

Python 3.11 gives the kernel no name for the threads it starts (each shows
the interpreter's); :func:`daemon_thread` makes the runtime's threads, each
running :func:`kernel_named` of its target, which names the thread first
(Linux ``prctl(PR_SET_NAME)``: 15 bytes at most, ``commsched-`` shortened to
``cs-``). Elsewhere, or where the call fails, the name is simply not set.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
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


def daemon_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """A daemon thread (not started) running ``target(*args)``, named ``name`` for Python and the kernel."""
    return threading.Thread(target=kernel_named(target, name), args=args, name=name, daemon=True)
