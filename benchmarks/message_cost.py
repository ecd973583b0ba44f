"""What one small message costs the CPU: gloo's all-reduce against the floor a plain TCP exchange sets.

    python benchmarks/message_cost.py --sizes-kib 4 64 1024 --ops 300 --repeats 5

Two ranks on loopback, each pinned to its own core (rank r to CPU r), one intra-op thread. For each
size, ``--ops`` operations one after another (each waited for before the next), timed per repeat;
prints for rank 0 the median over repeats of the wall time and the process's CPU time (every thread:
``time.process_time``) per operation, in microseconds:

``gloo``        ``dist.all_reduce`` on the default gloo group (PyTorch's default: two worker threads);
``gloo-1``      the same on a gloo group built with one worker thread (``ProcessGroupGloo`` options);
``direct``      the runtime's all-reduce of CPU tensors between 2 ranks, over its own connections
                (``Collectives``, :mod:`commsched.transport.direct`), started and waited for;
``tcp``         the floor: rank 0 sends its tensor over one TCP connection and receives rank 1's, rank 1
                the other way round, and each adds what it received; the same bytes as a ring
                all-reduce of two ranks moves per rank, with none of a collective library's work.

The many-message policies (WFBP, ByteScheduler, Prophet, Horovod's cycles) pay the first row once per
message on the core that also computes; the gap to the last row is what a cheaper small-message path
could save at most.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from commsched.transport.collectives import Collectives


def _timed(op: Callable[[], None], ops: int) -> tuple[float, float]:
    """Microseconds of wall and process CPU per operation over ``ops`` back-to-back operations."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(ops):
        op()
    return (time.perf_counter() - wall) / ops * 1e6, (time.process_time() - cpu) / ops * 1e6


def _one_thread_group(rank: int, port: int) -> dist.ProcessGroup:
    """A gloo group of both ranks whose backend runs collectives on one worker thread."""
    store = dist.TCPStore("127.0.0.1", port + 1, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._threads = 1
    options._timeout = datetime.timedelta(seconds=60)
    return dist.ProcessGroupGloo(store, rank, 2, options)  # type: ignore[return-value]


def _tcp_pair(rank: int, port: int) -> socket.socket:
    if rank == 0:
        with socket.create_server(("127.0.0.1", port + 2)) as server:
            conn, _ = server.accept()
    else:
        for _ in range(200):
            try:
                conn = socket.create_connection(("127.0.0.1", port + 2))
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        else:
            raise RuntimeError("rank 1 could not reach rank 0's TCP listener")
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _exchange(conn: socket.socket, rank: int, tensor: torch.Tensor, scratch: torch.Tensor) -> Callable[[], None]:
    out = memoryview(tensor.numpy()).cast("B")
    into = memoryview(scratch.numpy()).cast("B")

    def receive() -> None:
        got = 0
        while got < len(into):
            got += conn.recv_into(into[got:])

    def op() -> None:
        if rank == 0:
            conn.sendall(out)
            receive()
        else:
            receive()
            conn.sendall(out)
        tensor.add_(scratch)

    return op


def _gloo(group: dist.ProcessGroup | None, tensor: torch.Tensor) -> Callable[[], None]:
    """One all-reduce of ``tensor`` on ``group`` (None: the default group), waited for."""

    def op() -> None:
        if group is None:
            dist.all_reduce(tensor, async_op=True).wait()
        else:
            group.allreduce([tensor]).wait()

    return op


def rank_main(rank: int, args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=2)
    one_thread = _one_thread_group(rank, args.port)
    conn = _tcp_pair(rank, args.port)
    runtime = Collectives(dist.new_group(), timeout_s=60.0, ring=False, direct=True)
    rows = []
    for kib in args.sizes_kib:
        tensor = torch.ones(kib * 256)
        scratch = torch.empty_like(tensor)
        methods: dict[str, Callable[[], None]] = {
            "gloo": _gloo(None, tensor),
            "gloo-1": _gloo(one_thread, tensor),
            "direct": lambda tensor=tensor: runtime.all_reduce(tensor).wait(),
            "tcp": _exchange(conn, rank, tensor, scratch),
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
        for _ in range(args.repeats):
            for name, op in methods.items():  # in turns, so the host's drift falls on all alike
                dist.barrier()
                tensor.fill_(1.0)
                samples[name].append(_timed(op, args.ops))
        for name, got in samples.items():
            rows.append((name, kib, statistics.median(w for w, _ in got), statistics.median(c for _, c in got)))
    conn.close()
    runtime.close()
    dist.destroy_process_group()
    if rank == 0:
        print("| method | KiB | wall µs per op | CPU µs per op (process) |")
        print("|---|---|---|---|")
        for name, kib, wall, cpu in rows:
            print(f"| {name} | {kib} | {wall:.0f} | {cpu:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[4, 64, 1024], help="tensor sizes, KiB")
    parser.add_argument("--ops", type=int, default=300, help="operations per timed repeat (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per method (default: %(default)s)")
    parser.add_argument("--port", type=int, default=29565, help="rendezvous port; the next two are used too")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.sizes_kib) < 1 or args.ops < 1 or args.repeats < 1:
        parser.error("--sizes-kib, --ops and --repeats must be at least 1")
    if args.rank is not None:
        rank_main(args.rank, args)
        return
    argv = [sys.executable, __file__, "--port", str(args.port), "--ops", str(args.ops),
            "--repeats", str(args.repeats), "--sizes-kib", *map(str, args.sizes_kib), "--rank"]  # fmt: skip
    peer = subprocess.Popen([*argv, "1"])
    try:
        rank_main(0, args)
    finally:
        peer.wait(timeout=120)


if __name__ == "__main__":
    main()
