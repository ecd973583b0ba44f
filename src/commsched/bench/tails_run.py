"""Round-time tails on the emulated testbed: ps over TCP vs DLCP's PS mode, gloo vs DLCP's collective mode.

Every method of :mod:`commsched.bench.tails` runs the same rounds (a sleep of
the model's profiled forward + backward, then its gradient's partitions
exchanged) on one :class:`~commsched.testbed.netns.NetnsTestbed` with
``senders`` worker namespaces and one more for a dedicated server, in each
scenario (:func:`scenarios`):

``lossless``  every link at ``rate_bps`` (tbf in both directions, deep queues), nothing lost
``loss``      the same links, ``loss_pct`` % of every worker's IPv4 frames dropped as they enter the switch
``incast``    the same links, and every switch port toward a host at ``rate_bps`` with a shallow
              threshold: K = ``queue_pkts`` frames (ECT marked, the rest dropped, a virtual queue),
              buffer ``buffer_pkts``, bands as DLCP marks (:func:`dlcp_port`); the senders push
              into one server's port

Segmentation offloads are off on every link (qdiscs see frames). The
ratios printed against the DLCP targets (:mod:`commsched.bench.tails_report`)
are baseline / method (above 1: the method is faster), on the p50 and p99 of
the round time.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from commsched.bench.tails import (
    METHODS,
    Job,
    cpu_ms_per_round,
    datapath_rate,
    posting_ms,
    round_times,
    summarise,
    wire_floor_ms,
)
from commsched.bench.tails_report import ratio_lines
from commsched.testbed.commands import LinkShape, format_rate, shaper_burst_bytes
from commsched.testbed.launch import run_workers
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.switch import SwitchShape, apply_switch, disable_offloads, port_counters


@dataclass(frozen=True)
class Scenario:
    name: str
    link: LinkShape
    switch: SwitchShape | None
    methods: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class TailsConfig:
    senders: int = 4
    rounds: int = 1000
    warmup: int = 20
    model: str = "cnn"
    compute_ms: float | None = None  # None: the model's forward + backward, profiled here
    grad_mib: float | None = None  # None: the model's gradient
    partition_mib: float = 1.0
    split_tensors: bool = False  # cut a tensor larger than a partition into pieces, as the ps and dlcp policies do
    loss_bound: float = 0.01
    rate_bps: int = 300 * 10**6
    loss_pct: float = 1.0
    queue_pkts: int = 20
    buffer_pkts: int = 80
    scenarios: tuple[str, ...] = ("lossless", "loss", "incast")
    methods: tuple[str, ...] = tuple(METHODS)
    timeout_s: float = 60.0
    seed: int = 0
    mtu_bytes: int = 1500  # every veth's MTU (9000: jumbo frames); DLCP cuts its datagrams to it

    def __post_init__(self) -> None:
        problems = []
        if not 2 <= self.senders <= 64:
            problems.append(f"senders: must be between 2 and 64, got {self.senders!r}")
        if self.rounds < 1 or self.warmup < 1:
            problems.append(f"rounds, warmup: must be >= 1, got {self.rounds!r}, {self.warmup!r}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            problems.append(f"methods: unknown {unknown or '(none)'}; known: {', '.join(METHODS)}")
        bad = [s for s in self.scenarios if s not in ("lossless", "loss", "incast")]
        if bad or not self.scenarios:
            problems.append(f"scenarios: unknown {bad or '(none)'}; known: lossless, loss, incast")
        if not 0 <= self.loss_bound < 1:
            problems.append(f"loss_bound: must be in [0, 1), got {self.loss_bound!r}")
        if problems:
            raise ValueError("; ".join(problems))


def dlcp_port(rate_bps: int, queue_pkts: int, buffer_pkts: int, mtu_bytes: int = 1500) -> SwitchShape:
    """A switch port whose bands follow DLCP's marking: one band per layer class of important packets (the
    transport's :data:`~commsched.transport.dlcp.protocol.LAYER_DSCP`, front layers first), then the rest
    (DSCP 0: unimportant datagrams, every TCP connection, ARP) in the lowest band."""
    from commsched.transport.dlcp.protocol import LAYER_DSCP

    return SwitchShape(
        rate_bps=rate_bps,
        queue_pkts=queue_pkts,
        buffer_pkts=buffer_pkts,
        bands=len(LAYER_DSCP) + 1,
        dscp_bands=tuple((dscp, band) for band, dscp in enumerate(LAYER_DSCP)),
        default_band=len(LAYER_DSCP),
        mtu_bytes=mtu_bytes,
    )


def scenarios(config: TailsConfig) -> dict[str, Scenario]:
    """The scenarios of ``config``, each with the methods it compares (incast: the one-server methods)."""
    links = LinkShape(rate_bps=config.rate_bps)
    port = dlcp_port(config.rate_bps, config.queue_pkts, config.buffer_pkts, config.mtu_bytes)
    one_server = tuple(m for m in config.methods if METHODS[m].one_server)
    rate = format_rate(config.rate_bps)
    every = {
        "lossless": Scenario("lossless", links, None, config.methods, f"{rate} links, nothing lost"),
        "loss": Scenario(
            "loss",
            LinkShape(rate_bps=config.rate_bps, loss_pct=config.loss_pct),
            None,
            config.methods,
            f"{rate} links, {config.loss_pct:g} % random loss into the switch",
        ),
        "incast": Scenario(
            "incast", links, port, one_server,
            f"{config.senders} -> 1 server, {rate} switch ports, K {config.queue_pkts} frames, "
            f"buffer {config.buffer_pkts} (ECT marked, the rest dropped past K)",
        ),
    }  # fmt: skip
    return {name: every[name] for name in config.scenarios}


def profiled_compute_ms(model: str, batch: int = 8, iters: int = 10, seed: int = 0) -> float:
    """Median wall time of one forward + backward of ``model`` (batch ``batch``, one thread), ms."""
    import torch

    from commsched.models import build_model, model_loss, synthetic_batch

    torch.set_num_threads(1)
    net = build_model(model, seed)
    times = []
    for step in range(3 + iters):
        x, y = synthetic_batch(model, batch, seed, 0, step)
        start = time.perf_counter()
        model_loss(net(x), y).backward()
        times.append(time.perf_counter() - start)
        net.zero_grad()
    return statistics.median(times[3:]) * 1e3


def partitions(config: TailsConfig) -> tuple[int, ...]:
    """Element counts of the partitions, front first: the model's parameters in order, consecutive ones merged
    into pieces of about ``partition_mib``, or ``grad_mib`` split evenly into such pieces.

    A tensor larger than a partition stays whole unless ``split_tensors``; then it is cut, as the ``ps`` and
    ``dlcp`` policies cut it (:func:`commsched.schedule.fusion.partition`), into pieces of ``partition_mib``
    front first, and its rest starts the next piece."""
    limit = max(1, round(config.partition_mib * 2**20 / 4))
    if config.grad_mib is not None:
        total = max(1, round(config.grad_mib * 2**20 / 4))
        count = max(1, -(-total // limit))
        return tuple(total // count + (i < total % count) for i in range(count))
    from commsched.models import build_model

    out, current = [], 0
    for p in build_model(config.model, config.seed).parameters():
        numel = p.numel()
        if current and current + numel > limit:
            out.append(current)
            current = 0
        if config.split_tensors and numel > limit:
            whole, numel = divmod(numel, limit)
            out += [limit] * whole
        current += numel
    return (*out, current) if current else tuple(out)


def run_tails(
    config: TailsConfig, out_dir: Path, *, command_line: str = "", log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every scenario and method of ``config``; write ``tails.json`` under ``out_dir``; return the report."""
    say = log or (lambda message: print(message, file=sys.stderr, flush=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    compute_ms = config.compute_ms if config.compute_ms is not None else profiled_compute_ms(config.model)
    parts = partitions(config)
    report: dict[str, Any] = {
        "meta": {
            "command_line": command_line,
            "config": asdict(config),
            "compute_ms": compute_ms,
            "compute_source": "given" if config.compute_ms is not None else f"profiled: {config.model}, batch 8",
            "partitions_numel": list(parts),
            "gradient_mib": sum(parts) * 4 / 2**20,
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load_average": os.getloadavg()},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "definitions": {
                "round_ms": "per round: end of its last sender's exchange - end of the round before (sleep included)",
                "comm_ms": "per round: the longest exchange of any sender (end of its sleep to its last sum)",
                "ratio": "baseline / method of a percentile of round_ms (above 1: the method is faster)",
                "datagrams_per_cpu_s": "DLCP datagrams sent + received by a rank over the timed rounds per CPU "
                "second its process used in them",
                "cpu_ms_per_round": "CPU time a rank's process used per timed round (every thread), median and "
                "max over ranks",
            },
        },
        "scenarios": {},
    }
    say(f"tails: {compute_ms:.1f} ms of compute per round, {len(parts)} partitions, {sum(parts) * 4 / 2**20:.2f} MiB")
    with NetnsTestbed(config.senders + 1, mtu_bytes=config.mtu_bytes, log=say) as bed:
        launch = 0
        for scenario in scenarios(config).values():
            bed.set_shape(scenario.link)
            if scenario.switch is not None:
                apply_switch(bed, scenario.switch)
            else:
                disable_offloads(bed)
            entry: dict[str, Any] = {"description": scenario.description, "qdiscs": bed.qdiscs(), "methods": {}}
            for name in scenario.methods:
                job = Job(name, config.rounds, config.warmup, compute_ms, parts, config.loss_bound,
                          config.timeout_s, str(out_dir / scenario.name / name), config.seed,
                          config.mtu_bytes)  # fmt: skip
                entry["methods"][name] = _run_method(bed, job, config, scenario, launch, say)
                launch += 1
            report["scenarios"][scenario.name] = entry
            _write(report, out_dir)
    report["ratios"] = ratio_lines(report["scenarios"])
    report["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write(report, out_dir)
    return report


def _run_method(
    bed: NetnsTestbed, job: Job, config: TailsConfig, scenario: Scenario, launch: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """One launch: ``senders`` ranks (after a dedicated server in slot ``senders`` for one-server methods)."""
    world = job.world(config.senders)
    slots = [config.senders, *range(config.senders)] if world > config.senders else list(range(config.senders))
    directory = Path(job.out)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "job.json").write_text(json.dumps(asdict(job)))
    before = _port_counters(bed, scenario, config.senders)
    started = time.monotonic()
    rounds = job.warmup + job.rounds
    run_workers(
        bed,
        [sys.executable, "-m", "commsched.bench.tails", str(directory / "job.json")],
        log_dir=directory / "logs",
        timeout_s=120.0 + rounds * (job.compute_ms / 1e3 + job.timeout_s / 10),
        ranks=slots,
        name=job.method,
        launch=launch,
        fail_grace_s=min(job.timeout_s, 15.0) + 5.0,
        extra_env={"OMP_NUM_THREADS": "1"},
    )
    ranks = [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world)]
    times = round_times(ranks, job.warmup)
    summary = summarise(times["round_ms"])
    burst = shaper_burst_bytes(config.rate_bps)
    parts = [4 * numel for numel in job.partitions]  # float32
    wire = wire_floor_ms(job.method, config.senders, parts, config.rate_bps, job.loss_bound, burst)
    entry: dict[str, Any] = {
        "description": METHODS[job.method].description,
        "wall_s": time.monotonic() - started,
        "round": summary,
        "comm": summarise(times["comm_ms"]),
        "round_ms": times["round_ms"],
        "floor_ms": job.compute_ms + wire,
        "lost_numel_per_round_max": max((max(r["lost_numel"], default=0) for r in ranks), default=0),
        "ranks": [
            {k: v for k, v in r.items() if k not in ("starts_s", "comm_starts_s", "posted_s", "ends_s")} for r in ranks
        ],
    }
    posting = posting_ms(ranks, job.warmup)
    if posting is not None:
        entry["posting"] = posting
    rate = datapath_rate(ranks)
    if rate is not None:
        entry["datapath"] = rate
    cpu = cpu_ms_per_round(ranks, job.rounds)
    if cpu is not None:
        entry["cpu_ms_per_round"] = cpu
    after = _port_counters(bed, scenario, config.senders)
    if after is not None and before is not None:
        entry["server_port"] = {k: after[k] - before[k] for k in after}
    posted = f", posting p50 {posting['p50_ms']:.2f} ms" if posting is not None else ""
    say(f"tails: {scenario.name} {job.method}: round p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms "
        f"over {summary['rounds']:.0f} rounds{posted} ({entry['wall_s']:.0f} s)")  # fmt: skip
    return entry


def _port_counters(bed: NetnsTestbed, scenario: Scenario, server_slot: int) -> dict[str, int] | None:
    """Totals over the bands of the switch port toward the dedicated server (incast), None without a switch."""
    if scenario.switch is None:
        return None
    bands = port_counters(bed, server_slot, scenario.switch)
    keys = ("sent_pkts", "dropped", "marked", "early", "pdrop", "lost")
    return {k: sum(getattr(b, k) for b in bands) for k in keys}


def _write(report: dict[str, Any], out_dir: Path) -> None:
    tmp = out_dir / "tails.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(out_dir / "tails.json")
