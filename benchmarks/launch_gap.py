"""The gap a completion-driven launch costs: gloo all-reduces each launched when the previous completes
against the same all-reduces launched at once, with each rank's core idle and with a second thread
computing on it (as the backward does while ByteScheduler's credit frees up).

    python benchmarks/launch_gap.py --bytes 262144

Two ranks on loopback, each pinned to its own core (rank r to CPU r). Prints, per load, the median
over repeats of the milliseconds per all-reduce both ways and their difference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

OPS = 40
REPEATS = 15


def _busy(stop: threading.Event) -> None:
    a = torch.randn(192, 192)
    while not stop.is_set():
        a = torch.tanh(a @ a * 0.01)


def _per_op_ms(tensors: list[torch.Tensor], chained: bool) -> float:
    dist.barrier()
    start = time.perf_counter()
    if chained:
        for t in tensors:
            dist.all_reduce(t, async_op=True).wait()
    else:
        for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
            work.wait()
    return (time.perf_counter() - start) / len(tensors) * 1e3


def rank_main(rank: int, nbytes: int, port: int) -> None:
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensors = [torch.zeros(max(1, nbytes // 4)) for _ in range(OPS)]
    stop = threading.Event()
    for load in ("idle", "busy"):
        if load == "busy":
            threading.Thread(target=_busy, args=(stop,), daemon=True).start()
            time.sleep(0.2)
        queued = [_per_op_ms(tensors, chained=False) for _ in range(REPEATS)]
        chained = [_per_op_ms(tensors, chained=True) for _ in range(REPEATS)]
        if rank == 0:
            q, c = statistics.median(queued), statistics.median(chained)
            print(f"{nbytes} B, core {load}: at once {q:.3f} ms/op, chained {c:.3f} ms/op, gap {c - q:+.3f}")
    stop.set()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=262144, help="bytes per all-reduce")
    parser.add_argument("--port", type=int, default=29555)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.bytes, args.port)
        return
    argv = [sys.executable, __file__, "--bytes", str(args.bytes), "--port", str(args.port), "--rank"]
    peer = subprocess.Popen([*argv, "1"])
    try:
        rank_main(0, args.bytes, args.port)
    finally:
        peer.wait(timeout=60)


if __name__ == "__main__":
    main()
