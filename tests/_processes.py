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
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from commsched._sockets import free_port

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


def _rank(
    target: Callable[[int, int], dict[str, Any]], rank: int, world: int, port: int, out: Any, group_timeout_s: float
) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=group_timeout_s))
        result = target(rank, world)
    except BaseException:
        result = {"harness": traceback.format_exc()}
    out.put((rank, result))
    out.close()
    out.join_thread()  # flush before _exit, which would drop what the feeder thread still holds
    os._exit(0)  # skip teardown: after a fault scenario the process group may not shut down cleanly


def run_ranks(
    target: Callable[[int, int], dict[str, Any]],
    world: int,
    *,
    group_timeout_s: float,
    within_s: float,
    reporters: tuple[int, ...] | None = None,
) -> dict[int, dict[str, Any]]:
    """Run ``target(rank, world)`` on ``world`` gloo ranks; the dicts of the ``reporters`` (all ranks), by rank.

    Fails the test where a reporter raised (its traceback), exited without reporting, or did not report
    within ``within_s``."""
    expected = set(range(world) if reporters is None else reporters)
    out = context().Queue()
    port = free_port()
    procs = [process(_rank, (target, r, world, port, out, group_timeout_s)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + within_s
    try:
        while not expected <= results.keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"ranks {sorted(expected - results.keys())} did not report within {within_s} s")
            try:
                rank, result = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                # a rank that died without reporting would otherwise cost the whole wait
                dead = [r for r in expected - results.keys() if procs[r].exitcode is not None]
                if dead and out.empty():
                    pytest.fail(f"ranks {dead} exited without reporting")
                continue
            results[rank] = result
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    for r, result in results.items():
        assert "harness" not in result, f"rank {r} raised:\n{result['harness']}"
    return results
