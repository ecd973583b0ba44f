"""Communication-only rounds on the testbed: what each rank runs, and the round times they give.

A *round* is one synchronous iteration with its compute replaced by a sleep:
``compute_ms`` of sleep (the profiled forward + backward), then the
gradient's partitions are exchanged, all started at once, front layer
first; the round ends when every partition's sum has arrived. No compute
overlaps communication, so a round's time is the sleep plus the exchange,
and the tail of the exchange (retransmission timeouts, incast) is the tail
of the round. Each rank runs ``python -m commsched.bench.tails JOB.json``
(rank and rendezvous from the testbed's environment) and writes
``rank<r>.json``: per round, when it started, when its exchange started and
when it ended (``time.monotonic``, one clock for every namespace of the
machine), what a bounded-loss exchange lost, and the process's CPU time and
DLCP link counters over the timed rounds.

Methods (:data:`METHODS`), each over the same partitions:

``ps``       parameter server over TCP, every sender a server of 1/n of each partition (BytePS-style)
``ps1``      parameter server over TCP, one dedicated server (rank 0, no compute): n senders → 1
``dlcp_ps``  DLCP's PS mode on that one server: push at ``loss_bound``, pull reliable
``dlcp``     DLCP's collective mode (transpose all-reduce: every sender owns a shard), same bounds
``gloo``     gloo's ring all-reduce per partition, what PyTorch DDP does by default on CPUs
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np

#: Round-time percentiles reported (p50, p90, p99).
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Method:
    """How one method moves a partition: ``transport`` (tcp, dlcp, gloo), over a dedicated server or not."""

    transport: str
    one_server: bool
    bounded: bool
    description: str


METHODS = {
    "ps": Method("tcp", False, False, "parameter server over TCP, a shard on every sender"),
    "ps1": Method("tcp", True, False, "parameter server over TCP, one dedicated server"),
    "dlcp_ps": Method("dlcp", True, True, "DLCP PS mode: one dedicated server, push bounded, pull reliable"),
    "dlcp": Method("dlcp", False, True, "DLCP collective mode: transpose all-reduce, push bounded, pull reliable"),
    "gloo": Method("gloo", False, False, "gloo ring all-reduce (default DDP on CPUs)"),
}


@dataclass(frozen=True)
class Job:
    """What every rank of one launch runs; ``partitions``: the element count of each partition, front first."""

    method: str
    rounds: int
    warmup: int
    compute_ms: float
    partitions: tuple[int, ...]
    loss_bound: float
    timeout_s: float
    out: str
    seed: int = 0
    mtu_bytes: int = 1500

    def world(self, senders: int) -> int:
        """Processes of the launch: the senders, plus the dedicated server of a one-server method."""
        return senders + (1 if METHODS[self.method].one_server else 0)


# ------------------------------------------------------------------ the rounds (runs on a rank)


class _Transport(Protocol):
    def start(self, task: Any, buffer: Any) -> Any: ...

    def close(self) -> None: ...


def _open(method: Method, timeout_s: float, mtu_bytes: int) -> tuple[_Transport, Any]:
    """The transport of ``method`` on the default group, and what records its losses (a PsExchange) or None.

    DLCP's datagrams are cut to ``mtu_bytes`` (the links' MTU); TCP and gloo follow the links' MTU themselves.
    """
    from commsched.transport.base import CollectiveTransport, TransportOptions
    from commsched.transport.dlcp import open_dlcp_link
    from commsched.transport.link_exchange import LinkExchange
    from commsched.transport.tcp import TcpLink

    if method.transport == "gloo":
        return CollectiveTransport(None, timeout_s), None
    servers = (0,) if method.one_server else None
    if method.transport == "dlcp":
        link: Any = open_dlcp_link(None, timeout_s, TransportOptions(), mtu_bytes=mtu_bytes)
    else:
        link = TcpLink(None, timeout_s, TransportOptions())
    transport = LinkExchange(link, timeout_s, servers)
    return transport, transport.exchange


def run_rounds(job: Job, rank: int, world: int) -> dict[str, Any]:
    """Every round of ``job`` on this rank (the process group is up); returns what ``rank<r>.json`` holds."""
    import torch

    from commsched.schedule.base import CommTask, Segment
    from commsched.transport.base import TaskBuffer

    method = METHODS[job.method]
    server = method.one_server and rank == 0
    transport, exchange = _open(method, job.timeout_s, job.mtu_bytes)
    bound = job.loss_bound if method.bounded else 0.0
    tasks = [
        CommTask(i, "all_reduce", (Segment(i, 0, n),), 4 * n, f"p{i}", priority=i, transport=method.transport,
                 loss_bound=bound)
        for i, n in enumerate(job.partitions)
    ]  # fmt: skip
    generator = torch.Generator().manual_seed(job.seed + rank)
    grads = [torch.zeros(n) if server else torch.randn(n, generator=generator) for n in job.partitions]
    flats = [torch.empty(n) for n in job.partitions]
    starts, comm_starts, posted, ends, lost = [], [], [], [], []
    link: Any = getattr(transport, "link", None)
    stats = getattr(link, "stats", None)  # a DLCP link's counters
    cpu0, base = 0.0, (0, 0)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        for r in range(job.warmup + job.rounds):
            if r == job.warmup:
                cpu0 = time.process_time()
                usage0 = resource.getrusage(resource.RUSAGE_SELF)
                base = (stats.sent, stats.received) if stats is not None else (0, 0)
            starts.append(time.monotonic())
            for flat, grad in zip(flats, grads, strict=True):
                flat.copy_(grad)  # the sum lands in flat: start every round from the same gradient
            if not server:
                time.sleep(job.compute_ms / 1e3)
            comm_starts.append(time.monotonic())
            handles = [transport.start(t, TaskBuffer(f)) for t, f in zip(tasks, flats, strict=True)]
            posted.append(time.monotonic())
            for h in handles:
                h.wait(job.timeout_s)
            ends.append(time.monotonic())
            if exchange is not None:
                lost.append(sum(loss.lost_numel for loss in exchange.losses.values() if loss.step == r))
        cpu_s = time.process_time() - cpu0
        usage = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        transport.close()
    out: dict[str, Any] = {
        "rank": rank, "world": world, "server": server, "starts_s": starts, "comm_starts_s": comm_starts,
        "posted_s": posted, "ends_s": ends, "lost_numel": lost, "cpu_s": cpu_s,
        # the same CPU time in user space and in the kernel, and the threads' context switches (voluntary: waits)
        "user_s": usage.ru_utime - usage0.ru_utime, "system_s": usage.ru_stime - usage0.ru_stime,
        "waits": usage.ru_nvcsw - usage0.ru_nvcsw, "preempted": usage.ru_nivcsw - usage0.ru_nivcsw,
    }  # fmt: skip
    if stats is not None:  # whole-run counters, and the datagrams of the timed rounds
        keep = ("sent", "resent", "received", "written", "ecn_capable", "ce_marked", "duplicate", "late",
                "early_dropped", "probes", "bitmaps", "probes_held_out", "rcvbuf_requested_bytes",
                "rcvbuf_granted_bytes", "turns", "idle_turns", "host_queue_full", "send_calls",
                "recv_calls")  # fmt: skip
        timed = {"timed_sent": stats.sent - base[0], "timed_received": stats.received - base[1]}
        out["dlcp"] = {k: getattr(stats, k) for k in keep} | timed | {"rejected": dict(stats.rejected)}
        out["dlcp"]["rate"] = {str(peer): c for peer, c in link.rate_counters().items()}  # each destination's
    return out


def main() -> None:
    import torch
    import torch.distributed as dist

    data = json.loads(Path(sys.argv[1]).read_text())
    job = Job(**(data | {"partitions": tuple(data["partitions"])}))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=job.timeout_s))
    try:
        result = run_rounds(job, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (Path(job.out) / f"rank{rank}.json").write_text(json.dumps(result))


# ------------------------------------------------------------------ what the rounds give (pure)


def round_times(ranks: list[dict[str, Any]], warmup: int) -> dict[str, list[float]]:
    """Per timed round, from the sender ranks' records (a dedicated server's are left out):

    * ``round_ms``: the end of the round (the last sender's) minus the end of
      the round before — one iteration of the job, sleep included;
    * ``comm_ms``: the longest exchange of any sender in that round (from the
      end of its sleep to its last sum).
    """
    senders = [r for r in ranks if not r.get("server")]
    n = min(len(r["ends_s"]) for r in senders)
    if n <= warmup:
        raise ValueError(f"rounds: need more than the {warmup} warm-up rounds, got {n}")
    ends = np.array([r["ends_s"][:n] for r in senders]).max(axis=0)
    comm = np.array([np.subtract(r["ends_s"][:n], r["comm_starts_s"][:n]) for r in senders]).max(axis=0)
    first = max(warmup, 1)  # the first timed round needs the end of the one before
    return {"round_ms": list(np.diff(ends)[first - 1 :] * 1e3), "comm_ms": list(comm[first:] * 1e3)}


def posting_ms(ranks: list[dict[str, Any]], warmup: int) -> dict[str, float] | None:
    """How long the senders' training threads took to start every partition's exchange of a timed round (from
    the end of the sleep to the last ``start`` returning): median and p99 over the senders' timed rounds. None
    for records made before the harness kept it."""
    senders = [r for r in ranks if not r.get("server")]
    if not senders or any("posted_s" not in r for r in senders):
        return None
    ms = np.concatenate([np.subtract(r["posted_s"], r["comm_starts_s"])[warmup:] * 1e3 for r in senders])
    return {"p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99))}


def summarise(values_ms: list[float]) -> dict[str, float]:
    """Mean and the :data:`PERCENTILES` (``p50_ms``, ``p90_ms``, ``p99_ms``; numpy's linear interpolation)."""
    p = np.percentile(values_ms, PERCENTILES)
    out = {f"p{q}_ms": float(v) for q, v in zip(PERCENTILES, p, strict=True)}
    return out | {"mean_ms": float(np.mean(values_ms)), "max_ms": float(np.max(values_ms)), "rounds": len(values_ms)}


def wire_floor_ms(method: str, senders: int, partition_bytes: Sequence[int], rate_bps: int, loss_bound: float,
                  burst_bytes: int) -> float:  # fmt: skip
    """A lower bound on any exchange of ``method``'s pattern over these partitions, at ``rate_bps``, less what the
    shapers let through at once after the sleep (``burst_bytes`` a bucket). Headers, latency and CPU are not
    counted; a bounded push may leave ``loss_bound`` of its bytes unsent.

    * An all-reduce (shards on every sender, or a ring): each link carries (n-1)/n of the gradient out in
      each of two phases.
    * One server: its port takes in every sender's push of a partition before it can send the partition's
      sum out to every sender: a two-stage flow shop (in, then out), whose shortest schedule over every order
      of the partitions is Johnson's rule's (:func:`two_stage_makespan`). With pushes as large as pulls that
      is n x (the gradient + its largest partition): no order hides the pulls of the partition pushed last.
    """
    n, b = senders, burst_bytes
    push = (1 - loss_bound) if METHODS[method].bounded else 1.0
    if not METHODS[method].one_server:
        carried = (n - 1) / n * sum(partition_bytes) * (push + 1) - b
    else:  # a bucket on the way in and one on the way out
        carried = two_stage_makespan([(n * x * push, n * x) for x in partition_bytes]) - 2 * b
    return max(0.0, carried) * 8 / rate_bps * 1e3


def two_stage_makespan(jobs: Sequence[tuple[float, float]]) -> float:
    """The least time to run ``jobs`` (first stage, second stage) through two machines, each job's second stage
    after its first (Johnson, 1954: those shorter on the first machine first, by it ascending, then the rest by
    their second stage descending). A few lines, so written here rather than taken from a scheduling library."""
    early = sorted((j for j in jobs if j[0] <= j[1]), key=lambda j: j[0])
    late = sorted((j for j in jobs if j[0] > j[1]), key=lambda j: -j[1])
    first = second = 0.0
    for a, b in early + late:
        first += a
        second = max(second, first) + b
    return second


def datapath_rate(ranks: list[dict[str, Any]]) -> dict[str, float] | None:
    """DLCP datagrams each rank's process handled (sent + received) per CPU second it used over the timed
    rounds (median and max over ranks): the data path's packet rate per core. None for other methods."""
    rates = [
        (r["dlcp"]["timed_sent"] + r["dlcp"]["timed_received"]) / r["cpu_s"]
        for r in ranks
        if "dlcp" in r and r["cpu_s"]
    ]
    if not rates:
        return None
    return {"datagrams_per_cpu_s_median": float(np.median(rates)), "datagrams_per_cpu_s_max": float(max(rates))}


def cpu_ms_per_round(ranks: list[dict[str, Any]], rounds: int) -> dict[str, float] | None:
    """CPU time each rank's process used per timed round (every thread: the transport's work included), median
    and max over ranks (the max: the busiest process, a dedicated server's in PS mode). None without rounds."""
    if rounds < 1 or not ranks:
        return None
    per_round = [1e3 * r["cpu_s"] / rounds for r in ranks]
    return {"median": float(np.median(per_round)), "max": float(max(per_round))}


if __name__ == "__main__":
    main()
