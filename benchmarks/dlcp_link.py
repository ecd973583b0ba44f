"""Data-path speed of a DLCP link on loopback: two processes, one 16 MiB float32 transfer at a time.

Rank 0 sends, rank 1 receives at loss bound 0; each repeat is timed from the
moment both sides have posted (a barrier over a pipe) to the receive's end.
Prints the median over the repeats of MB/s (10⁶ bytes of payload per second)
and DATA datagrams per second, with the link's counters (re-sends,
datagrams the receive socket dropped show up as re-sends).

    python benchmarks/dlcp_link.py [--mib 16] [--repeats 5] [--mtu 1500 9000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection

import torch

from commsched.transport.dlcp.link import DlcpLink
from commsched.transport.dlcp.sockets import LinkSockets
from commsched.transport.links import TransferKey

KEY = bytes(range(32))


def worker(rank: int, pipe: Connection, numel: int, repeats: int, mtu: int) -> None:
    torch.set_num_threads(1)
    sockets = LinkSockets("127.0.0.1")
    pipe.send(sockets.endpoints)
    peers = pipe.recv()
    link = DlcpLink(rank, 2, sockets, peers, KEY, timeout_s=60.0, mtu_bytes=mtu)
    data = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    out = torch.empty(numel)
    walls = []
    for step in range(repeats):
        key = TransferKey(step, 0, 0)
        pipe.send("ready")
        pipe.recv()  # both ranks are here
        start = time.perf_counter()
        if rank == 0:
            link.send(1, key, data).wait(60.0)
        else:
            received = link.recv(0, key, out).wait(60.0)
            walls.append(time.perf_counter() - start)
            assert received.lost == 0 and torch.equal(out, data)
            out.zero_()
    stats = link.stats
    pipe.send((walls, stats.sent, stats.resent, stats.received, stats.written, stats.duplicate))
    link.close()


def run(mib: int, repeats: int, mtu: int) -> None:
    numel = mib * 2**20 // 4
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for rank in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(rank, child, numel, repeats, mtu))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    endpoints = [p.recv() for p in pipes]
    for p in pipes:
        p.send(endpoints)
    for _ in range(repeats):
        for p in pipes:
            assert p.recv() == "ready"
        for p in pipes:
            p.send("go")
    results = [p.recv() for p in pipes]
    for proc in procs:
        proc.join(30)
    walls, *_ = results[1]
    _, sent, resent, *_ = results[0]
    _, _, _, received, written, duplicate = results[1]
    wall = statistics.median(walls)
    datagrams = written / repeats
    print(
        f"MTU {mtu:>5}: {mib * 2**20 / wall / 1e6:7.1f} MB/s  {datagrams / wall:9.0f} datagrams/s  "
        f"({wall * 1e3:.0f} ms per {mib} MiB; sent {sent}, re-sent {resent}, received {received}, "
        f"duplicates {duplicate}, over {repeats} transfers)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mtu", type=int, nargs="+", default=[1500, 9000])
    args = parser.parse_args()
    for mtu in args.mtu:
        run(args.mib, args.repeats, mtu)


if __name__ == "__main__":
    main()
