"""Worker processes for multi-process tests, forked from one server that imported torch once.

A ``spawn`` worker starts a fresh interpreter and imports torch and commsched: about 2.5 s of one core
each, and the suite starts several hundred. A ``forkserver`` worker is forked from a server process that
imported them once, so it starts in milliseconds; it is still a clean process (no state of the test
process, no threads: the server runs none), as ``spawn`` gives. What it would not get is the test
process's environment as it is *now* (the server's was fixed when it started), so :func:`start` hands
that to each worker before its target runs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

#: imported once by the server, so that every worker starts with them
PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch.optim", "commsched", "commsched.runtime"]


def context() -> BaseContext:
    """The forkserver context, with :data:`PRELOAD` imported by its server."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _with_environ(environ: dict[str, str], target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(environ)
    target(*args)


def process(target: Callable[..., Any], args: tuple[Any, ...]) -> BaseProcess:
    """A worker that runs ``target(*args)`` with the test process's environment of this moment."""
    return context().Process(target=_with_environ, args=(dict(os.environ), target, args))
