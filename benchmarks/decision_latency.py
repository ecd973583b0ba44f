"""How long a deciding leader's order takes to reach a follower, one way, on this host's loopback.

Two processes (gloo for the opening); rank 0 sends ``--messages`` orders, one
every 2 ms, each carrying its send time (``time.perf_counter_ns``, the same
monotonic clock in both processes on one host); rank 1 reports each
arrival's delay. Three paths side by side, in one run:

* ``decisions``: :class:`commsched.runtime.decisions.DecisionChannel`, what
  the runtime uses;
* ``tcplink``: one frame through :class:`commsched.transport.tcp.TcpLink`
  (a sender thread and a reader thread in between);
* ``socket``: a bare TCP socket, written and read by the two threads that
  send and act (the floor).

With ``--busy`` each process also runs a thread of small matrix products
holding the GIL between them, as a training thread does between its
operators.

    python benchmarks/decision_latency.py --messages 500 --busy
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commsched._sockets import free_port

PATHS = ("decisions", "tcplink", "socket")


def busy_loop(stop: threading.Event) -> None:
    x = torch.randn(128, 128)
    while not stop.is_set():
        x = torch.tanh(x @ x * 0.01)


def run_path(path: str, rank: int, messages: int) -> list[float]:
    """Rank 1: one-way delays in µs; rank 0: []."""
    from commsched.runtime.decisions import DecisionChannel
    from commsched.transport import TransportOptions
    from commsched.transport.links import TransferKey
    from commsched.transport.tcp import TcpLink

    options = TransportOptions(bind="127.0.0.1")
    delays: list[float] = []
    if path == "decisions":
        channel = DecisionChannel(None, 30.0, options)
        for i in range(messages):
            if rank == 0:
                channel.send([time.perf_counter_ns(), i])
                time.sleep(0.002)
            else:
                values = channel.receive()
                assert values is not None
                delays.append((time.perf_counter_ns() - values[0]) / 1e3)
        dist.barrier()
        channel.close()
    elif path == "tcplink":
        link = TcpLink(None, 30.0, options, star=True)
        for i in range(messages):
            if rank == 0:
                link.send(1, TransferKey(i, 0, 0), torch.tensor([time.perf_counter_ns(), i])).wait()
                time.sleep(0.002)
            else:
                out = torch.zeros(2, dtype=torch.long)
                link.recv(0, TransferKey(i, 0, 0), out).wait()
                delays.append((time.perf_counter_ns() - int(out[0])) / 1e3)
        dist.barrier()
        link.close(5.0)
    else:
        port: list[Any] = [None]
        if rank == 1:
            listener = socket.create_server(("127.0.0.1", 0))
            port[0] = listener.getsockname()[1]
        dist.broadcast_object_list(port, src=1)
        if rank == 0:
            sock = socket.create_connection(("127.0.0.1", port[0]))
        else:
            sock, _ = listener.accept()
            listener.close()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(messages):
            if rank == 0:
                sock.sendall(time.perf_counter_ns().to_bytes(8, "little") + i.to_bytes(8, "little"))
                time.sleep(0.002)
            else:
                data = b""
                while len(data) < 16:
                    data += sock.recv(16 - len(data))
                delays.append((time.perf_counter_ns() - int.from_bytes(data[:8], "little")) / 1e3)
        dist.barrier()
        sock.close()
    return delays


def worker(rank: int, port: int, messages: int, busy: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    stop = threading.Event()
    spinner = threading.Thread(target=busy_loop, args=(stop,), daemon=True)
    if busy:
        spinner.start()
    results = {path: run_path(path, rank, messages) for path in PATHS}
    stop.set()
    if busy:
        spinner.join()  # no torch work left running at exit
    if rank == 1:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def summary(delays: list[float]) -> dict[str, float]:
    kept = delays[len(delays) // 10 :]  # connections warm
    q = statistics.quantiles(kept, n=100)
    return {"median_us": statistics.median(kept), "p90_us": q[89], "p99_us": q[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--busy", action="store_true", help="a thread computing beside each process's work")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()
    if args.messages < 20:
        parser.error(f"--messages must be >= 20, got {args.messages}")
    port = free_port()
    out = f"/tmp/decision-latency-{os.getpid()}.json"
    mp.spawn(worker, args=(port, args.messages, args.busy, out), nprocs=2)
    with open(out) as f:
        delays = json.load(f)
    os.unlink(out)
    rows = {path: summary(delays[path]) for path in PATHS}
    print(f"one-way delay of an order, µs ({args.messages} messages{', busy' if args.busy else ''}):")
    print(f"{'path':<10} {'median':>8} {'p90':>8} {'p99':>8}")
    for path, row in rows.items():
        print(f"{path:<10} {row['median_us']:8.0f} {row['p90_us']:8.0f} {row['p99_us']:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"messages": args.messages, "busy": args.busy, "paths": rows}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
