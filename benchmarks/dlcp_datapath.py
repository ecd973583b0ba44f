"""DLCP's data path over loopback: datagrams per CPU second on each side, and a DLCP round against TCP's.

Two measurements, each in fresh processes, every variant interleaved launch
by launch so that variants share the machine's load:

``datagrams``: two processes, one DlcpLink each (one I/O thread per side);
rank 0 sends ``--mib`` MiB of float32 to rank 1 at loss bound 0,
``--transfers`` times per launch (after one warm-up transfer), and every
transfer must arrive bit-exact. Each side reports the CPU time its process
used over the timed transfers (``time.process_time``: the I/O thread; the
main thread only waits) and the datagrams it sent or received, so the
sender's datagrams per CPU second is the send path's packet rate per core
and the receiver's the receive path's; also the system calls that carried
them (fewer than the datagrams where UDP GSO/GRO batch them). CPU time is
far less sensitive than wall time to other load; wall MB/s is printed too.
``--batch off`` / ``both`` adds links without UDP GSO/GRO
(``LinkSockets(udp_offload=False)``): one datagram per system call.
``--burst-kib`` adds pacer bursts (``RateParams.burst_bytes``; 0: the
default, 8 KiB): a GSO batch holds what one turn of the pacer lets go, so
the burst caps the datagrams per system call (8 KiB: about 5 of 1,500
bytes, one of 9,000).

``rounds``: the communication-only rounds of :mod:`commsched.bench.tails`
(no compute: ``compute_ms`` 0) on 2 ranks over loopback, the same
partitions through ``ps`` (the parameter-server exchange over TCP) and
``dlcp`` (the same exchange over DLCP, collective mode, ``--loss-bound``,
default 0: the same bytes arrive), so a round's time is the transport's
alone; per method p50/p90 of the round time and DLCP's datagrams per CPU
second, then DLCP's p50 over TCP's.

``--tree NAME=PATH`` runs the same measurements against another checkout
(its ``src`` first on ``PYTHONPATH``), for a before/after comparison::

    git archive <commit> src | tar -x -C /tmp/before
    python benchmarks/dlcp_datapath.py --tree before=/tmp/before

Timings taken on a loaded machine are not results.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from commsched._sockets import free_port
from commsched.bench.tails import Job, datapath_rate, round_times, summarise

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import inspect, json, os, socket, sys, time
import torch
from commsched.transport.dlcp.link import DlcpLink
from commsched.transport.dlcp.sockets import Endpoints, LinkSockets
from commsched.transport.links import TransferKey

rank, port, numel, transfers, mtu, batch, burst = (int(a) for a in sys.argv[1:8])
torch.set_num_threads(1)
f = socket.create_connection(("127.0.0.1", port)).makefile("rw")
def say(obj):
    f.write(json.dumps(obj) + "\n"); f.flush()
def hear():
    return json.loads(f.readline())
offload = {"udp_offload": bool(batch)} if "udp_offload" in inspect.signature(LinkSockets).parameters else {}
sockets = LinkSockets("127.0.0.1", **offload)
say({"rank": rank, "endpoints": [list(map(list, sockets.endpoints.data)), list(sockets.endpoints.control)]})
peers = [Endpoints(tuple(tuple(a) for a in p[0]), tuple(p[1])) for p in hear()]
knobs = {}
if burst:  # the pacer's burst (RateParams.burst_bytes), with the link's own ack slack
    from commsched.transport.dlcp.protocol import datagrams_per_ack
    from commsched.transport.dlcp.rate import RateParams
    knobs["rate"] = RateParams(ack_slack=datagrams_per_ack(mtu), burst_bytes=burst)
link = DlcpLink(rank, 2, sockets, peers, b"k" * 32, timeout_s=60.0, mtu_bytes=mtu, **knobs)
data = torch.randn(numel, generator=torch.Generator().manual_seed(0))
out = torch.empty(numel)
stats, walls = link.stats, []
def counters():
    return [getattr(stats, name, 0) for name in ("sent", "received", "send_calls", "recv_calls")]
for step in range(transfers + 1):  # the first transfer warms up (the rate's start, page faults)
    if step == 1:
        cpu0, base = time.process_time(), counters()
    say("ready"); hear()
    start = time.perf_counter()
    if rank == 0:
        link.send(1, TransferKey(step, 0, 0), data).wait(60.0)
    else:
        got = link.recv(0, TransferKey(step, 0, 0), out).wait(60.0)
        assert got.lost == 0 and torch.equal(out, data), "a transfer at bound 0 arrived incomplete"
        out.zero_()
    walls.append(time.perf_counter() - start)
cpu = time.process_time() - cpu0
sent, received, send_calls, recv_calls = (a - b for a, b in zip(counters(), base))
say({"cpu_s": cpu, "sent": sent, "received": received, "send_calls": send_calls, "recv_calls": recv_calls,
     "walls": walls[1:], "resent": stats.resent, "send_errors": stats.send_errors,
     "offload": str(getattr(link, "offload", "n/a"))})
link.close()
"""


def _env(src: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(src / "src"), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def launch_datagrams(
    src: Path, numel: int, transfers: int, mtu: int, batch: bool, burst_bytes: int
) -> list[dict[str, Any]]:
    """One sender and one receiver process on ``src``'s package (``burst_bytes`` 0: the pacer's default burst);
    their reports, by rank."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        argv = [str(port), str(numel), str(transfers), str(mtu), str(int(batch)), str(burst_bytes)]
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), *argv], env=_env(src)) for r in range(2)]
        try:
            server.settimeout(120.0)
            conns = [server.accept()[0].makefile("rw") for _ in range(2)]
            first = [json.loads(c.readline()) for c in conns]  # the ranks connect in any order
            by_rank = sorted(range(2), key=lambda i: first[i]["rank"])
            endpoints = [first[i]["endpoints"] for i in by_rank]
            for c in conns:
                c.write(json.dumps(endpoints) + "\n")
                c.flush()
            for _ in range(transfers + 1):
                for c in conns:
                    if json.loads(c.readline() or "null") != "ready":
                        raise RuntimeError("a worker died (its traceback is above)")
                for c in conns:
                    c.write('"go"\n')
                    c.flush()
            reports = [json.loads(conns[i].readline()) for i in by_rank]
        finally:
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
    return reports


def launch_rounds(src: Path, method: str, job: dict[str, Any]) -> dict[str, Any]:
    """The rounds of :mod:`commsched.bench.tails` on 2 ranks over loopback: their times and DLCP's packet rate."""
    with tempfile.TemporaryDirectory(prefix="dlcp-rounds-") as out:
        spec = Job(**{**job, "method": method, "out": out})
        Path(out, "job.json").write_text(json.dumps(asdict(spec)))
        master_port = free_port()
        procs = []
        for rank in range(2):
            env = _env(src) | {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(master_port)}  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, "-m", "commsched.bench.tails", f"{out}/job.json"], env=env))
        limit_s = 120.0 + (spec.warmup + spec.rounds) * spec.timeout_s / 10
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(limit_s))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if any(codes):
            raise RuntimeError(f"rounds of {method}: the ranks exited with {codes} (tracebacks above)")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    times = round_times(ranks, spec.warmup)
    return {"round": summarise(times["round_ms"]), "datapath": datapath_rate(ranks),
            "lost_numel_max": max(max(r["lost_numel"], default=0) for r in ranks)}  # fmt: skip


def report_datagrams(results: dict[tuple[str, int], list[list[dict[str, Any]]]], mib: int) -> None:
    print(f"{'variant':32} {'MTU':>5} {'send dgram/CPU-s':>17} {'dgram/send call':>16} {'recv dgram/CPU-s':>17} "
          f"{'dgram/recv call':>16} {'MB/s (wall)':>12}  offload")  # fmt: skip
    for (name, mtu), launches in results.items():
        send = statistics.median(r[0]["sent"] / r[0]["cpu_s"] for r in launches)
        recv = statistics.median(r[1]["received"] / r[1]["cpu_s"] for r in launches)
        per_send = statistics.median(r[0]["sent"] / max(r[0]["send_calls"], 1) for r in launches)
        per_recv = statistics.median(r[1]["received"] / max(r[1]["recv_calls"], 1) for r in launches)
        wall = statistics.median(w for r in launches for w in r[1]["walls"])
        print(f"{name:32} {mtu:>5} {send:>17,.0f} {per_send:>16.1f} {recv:>17,.0f} {per_recv:>16.1f} "
              f"{mib * 2**20 / wall / 1e6:>12.1f}  {launches[0][0]['offload']}")  # fmt: skip


def report_rounds(results: dict[tuple[str, str, int], list[dict[str, Any]]]) -> None:
    print(f"{'variant':16} {'method':6} {'MTU':>5} {'p50 ms':>8} {'p90 ms':>8} {'DLCP dgram/CPU-s':>17}")
    p50: dict[tuple[str, str, int], float] = {}
    for (name, method, mtu), launches in results.items():
        p50[name, method, mtu] = statistics.median(r["round"]["p50_ms"] for r in launches)
        p90 = statistics.median(r["round"]["p90_ms"] for r in launches)
        rates = [r["datapath"]["datagrams_per_cpu_s_median"] for r in launches if r["datapath"]]
        rate = f"{statistics.median(rates):>17,.0f}" if rates else f"{'-':>17}"
        print(f"{name:16} {method:6} {mtu:>5} {p50[name, method, mtu]:>8.2f} {p90:>8.2f} {rate}")
    for (name, method, mtu), value in p50.items():
        if method == "dlcp" and (name, "ps", mtu) in p50:
            print(f"{name} MTU {mtu}: DLCP round p50 / TCP round p50 = {value / p50[name, 'ps', mtu]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["datagrams", "rounds", "both"], default="both")
    parser.add_argument("--launches", type=int, default=3, help="launches per variant, interleaved")
    parser.add_argument("--mtu", type=int, nargs="+", default=[1500, 9000])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of another checkout to compare")
    parser.add_argument("--mib", type=int, default=16, help="datagrams: MiB per transfer")
    parser.add_argument("--transfers", type=int, default=4, help="datagrams: timed transfers per launch")
    parser.add_argument("--batch", choices=["on", "off", "both"], default="both", help="datagrams: UDP GSO/GRO")
    parser.add_argument("--burst-kib", type=int, nargs="+", default=[0],
                        help="datagrams: the pacer's burst (RateParams.burst_bytes), KiB; 0: default")  # fmt: skip
    parser.add_argument("--round-kib", type=int, nargs="+", default=[1024, 1024, 640],
                        help="rounds: the partitions' sizes, front first")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=300, help="rounds: timed rounds per launch")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--loss-bound", type=float, default=0.0, help="rounds: DLCP's push bound")
    parser.add_argument("--json", type=Path, default=None, help="write every launch's reports here")
    args = parser.parse_args()
    trees = [(spec.partition("=")[0], Path(spec.partition("=")[2])) for spec in args.tree] + [("this", ROOT)]
    dump: dict[str, Any] = {}
    if args.part in ("datagrams", "both"):
        numel = args.mib * 2**20 // 4
        batches = {"on": [True], "off": [False], "both": [True, False]}[args.batch]
        variants = [
            (f"{name}{'' if b else ' (no GSO/GRO)'}{f' burst {k} KiB' if k else ''}", path, b, k * 1024)
            for name, path in trees
            for b in batches
            for k in args.burst_kib
        ]
        datagrams: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
        for _ in range(args.launches):
            for mtu in args.mtu:
                for name, path, batch, burst_bytes in variants:
                    reports = launch_datagrams(path, numel, args.transfers, mtu, batch, burst_bytes)
                    datagrams.setdefault((name, mtu), []).append(reports)
        report_datagrams(datagrams, args.mib)
        dump["datagrams"] = {f"{n}@{m}": v for (n, m), v in datagrams.items()}
    if args.part in ("rounds", "both"):
        job = {"rounds": args.rounds, "warmup": args.warmup, "compute_ms": 0.0, "loss_bound": args.loss_bound,
               "partitions": tuple(kib * 256 for kib in args.round_kib), "timeout_s": 60.0}  # fmt: skip
        rounds: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for _ in range(args.launches):
            for mtu in args.mtu:
                for name, path in trees:
                    for method in ("ps", "dlcp"):
                        result = launch_rounds(path, method, job | {"mtu_bytes": mtu})
                        rounds.setdefault((name, method, mtu), []).append(result)
        report_rounds(rounds)
        dump["rounds"] = {f"{n}/{m}@{u}": v for (n, m, u), v in rounds.items()}
    if args.json is not None:
        args.json.write_text(json.dumps(dump, indent=1))


if __name__ == "__main__":
    main()
