"""The network probe from one process: across ``N`` local gloo processes on 127.0.0.1.

>>> probe = probe_local(world_size=2)
>>> cluster = probe.cluster()

The processes are spawned; each runs the measurement of
:func:`~commsched.profile.network.probe_network`, rank 0 sends its progress
lines and the samples back through a queue, and the α-β fit is made in the
calling process.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from commsched._sockets import free_port
from commsched.errors import RuntimeCommError, SpecError
from commsched.profile.network import DEFAULT_SIZES_BYTES, OPS, NetworkProbe, measure_ops
from commsched.profile.probe_fit import ProbeSample, fit_alpha_beta

__all__ = ["probe_local"]


def _local_rank(
    rank: int,
    world: int,
    port: int,
    sizes_bytes: list[int],
    repeats: int,
    warmup: int,
    threads: int,
    timeout_s: float,
    ops: tuple[str, ...],
    out: Any,
) -> None:
    """One process of :func:`probe_local`; rank 0 reports progress and the result through ``out``."""
    try:
        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            report = (lambda line: out.put(("progress", line))) if rank == 0 else None
            samples = measure_ops(None, sizes_bytes, repeats, warmup, ops, report)
            if rank == 0:
                out.put(("result", samples))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        out.put(("error", f"rank {rank}: {exc!r}\n{traceback.format_exc()}"))


def probe_local(
    world_size: int = 2,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 10,
    *,
    warmup: int = 2,
    threads: int = 1,
    timeout_s: float = 300.0,
    ops: Sequence[str] = OPS,
    progress: Callable[[str], None] | None = None,
) -> NetworkProbe:
    """:func:`probe_network` across ``world_size`` new processes on this machine (gloo over 127.0.0.1).

    Each process uses ``threads`` intra-op threads. The processes are spawned
    (so a script calling this needs the ``if __name__ == "__main__":`` guard)
    and joined here; ``timeout_s`` bounds the whole run (RuntimeCommError when
    it runs out or a process fails). The fit is made here, from every op's
    samples (SpecError if the times do not grow with size: widen the sizes).
    """
    if world_size < 2:
        raise SpecError("network probe", [f"world_size: must be >= 2, got {world_size}"])
    if "all_reduce" not in ops:
        raise SpecError("network probe", [f"ops: must include all_reduce (α and β come from it), got {list(ops)}"])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    args = (world_size, port, [int(s) for s in sizes_bytes], repeats, warmup, threads, timeout_s, tuple(ops), out)
    procs = [ctx.Process(target=_local_rank, args=(r, *args), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    result: tuple[ProbeSample, ...] | None = None
    try:
        while result is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeCommError(f"network probe: no result from {world_size} local processes in {timeout_s:g} s")
            try:
                kind, payload = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeCommError(
                        f"network probe: process {procs.index(dead[0])} exited with status {dead[0].exitcode}"
                    ) from None
                continue
            if kind == "progress" and progress:
                progress(payload)
            elif kind == "error":
                raise RuntimeCommError(f"network probe failed on {payload}")
            elif kind == "result":
                result = payload
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    fit = fit_alpha_beta(result, "all_reduce")
    return NetworkProbe(fit.alpha_s, fit.beta_s_per_byte, result)
