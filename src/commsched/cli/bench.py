"""``commsched bench``: real training on an emulated cluster (network namespaces + tc), policies vs PyTorch DDP."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from commsched.bench.baselines import DEFAULT_DDP, YARDSTICK
from commsched.bench.config import DEFAULT_POLICIES, MIN_WARMUP, BenchConfig
from commsched.bench.plot import plot
from commsched.bench.report import grid_table, session_table, shaping, validation_table
from commsched.bench.run import run_bench
from commsched.bench.significance import auto_vs_best
from commsched.cli import bench_plan
from commsched.cli.inputs import KNOB_HELP, KnobAssignment, knobs_by_policy
from commsched.cli.progress import progress
from commsched.errors import ScheduleError
from commsched.models import MODELS
from commsched.schedule import RUNTIME_POLICIES, TORCH_DDP
from commsched.testbed import LinkShape, netns_unavailable_reason, parse_rate
from commsched.testbed.netns import link_unavailable_reason


def _refuse_what_cannot_be_built(shapes: tuple[LinkShape, ...], isolation: str) -> None:
    """Where namespaces work, refuse at once a delay this kernel cannot make (no netem) or a loss it cannot (no
    nftables), naming what is missing; without them the run falls back to unshaped links and says so."""
    if isolation == "loopback" or netns_unavailable_reason() is not None:
        return
    for shape in shapes:
        reason = link_unavailable_reason(shape)
        if reason is not None:
            hint = "--delay/--jitter" if "netem" in reason else "--loss"
            raise click.BadParameter(reason, param_hint=hint)


@click.command("bench")
@click.option("--model", type=click.Choice(list(MODELS)), default="resnet5m", show_default=True)
@click.option("--workers", type=click.IntRange(2, 64), default=4, show_default=True, help="ranks, one namespace each")
@click.option(
    "--bandwidth",
    default="none",
    show_default=True,
    help="per-worker link rate, both directions (tbf): e.g. 1gbit, 300mbit, none; a comma list runs one session each",
)
@click.option(
    "--delay",
    type=click.FloatRange(0),
    default=0.0,
    help="one-way delay between workers, ms (tc netem; refused where the kernel lacks it)",
)
@click.option("--jitter", type=click.FloatRange(0), default=0.0, help="delay jitter, ms (tc netem, as --delay)")
@click.option(
    "--loss",
    type=click.FloatRange(0, 100, max_open=True),
    default=0.0,
    help="random loss, % of the packets each worker sends, dropped as they enter the switch (an nftables rule in "
    "the bridge: a loss in the network, which TCP learns of from missing ACKs)",
)
@click.option(
    "--policies",
    default=",".join(DEFAULT_POLICIES),
    show_default=True,
    help="commsched policies, comma list (PyTorch DDP's configurations run whatever this says)",
)
@click.option("--iters", type=click.IntRange(1), default=10, show_default=True, help="timed iterations per run")
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=MIN_WARMUP,
    show_default=True,
    help=f"untimed iterations first; at least {MIN_WARMUP} unless only torch_ddp runs "
    "(a commsched policy profiles 2 iterations, then switches plans)",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=8, show_default=True, help="per-rank batch size")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True, help="torch intra-op threads per rank")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--comm-timeout", type=click.FloatRange(1), default=60.0, show_default=True, help="s; a dead peer ends the run"
)
@click.option("--knob", "-k", "knobs", multiple=True, type=KnobAssignment(), help=KNOB_HELP)
@click.option(
    "--ddp-grid/--no-ddp-grid",
    default=True,
    show_default=True,
    help="measure PyTorch DDP with bucket_cap_mb 1, 4, 25 × find_unused_parameters False, True, for the default "
    f"DDP ({DEFAULT_DDP.name}) and best DDP rows; off: only torch_ddp, default DDP and {YARDSTICK} (quick runs)",
)
@click.option("--no-references", is_flag=True, help="skip compute-alone and all-reduce-alone")
@click.option("--no-probe", is_flag=True, help="skip the TCP throughput/RTT check of each shaping")
@click.option(
    "--pin-cores",
    is_flag=True,
    help="pin worker r's process, every thread of it, to core r (one core each; needs a core per worker); "
    "off: the workers share every core",
)
@click.option(
    "--validate",
    is_flag=True,
    help="before each session, measure the links (α-β) and the model's per-layer compute on this testbed, "
    "and print the simulator's predicted iteration time of every policy beside the measured one",
)
@click.option(
    "--mtu",
    type=click.IntRange(576, 65535),
    default=1500,
    show_default=True,
    help="every link's MTU in bytes (9000: jumbo frames); the dlcp transport cuts its datagrams to it, "
    "TCP and gloo follow it themselves",
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "netns", "loopback"]),
    default="auto",
    show_default=True,
    help="auto: namespaces when root, else plain local processes (unshaped)",
)
@click.option(
    "--plan",
    "plan",
    metavar="PLAN.json|auto",
    help="measure a heterogeneous plan (a `commsched plan -o` file, or auto: planned on the testbed as measured) "
    "against even DP (default DDP) and speed-proportional DP on workers of different CPU speed and link rate "
    "(needs root); see --worker-cpu, --worker-links",
)
@click.option("--worker-cpu", help=bench_plan.CPU_HELP)
@click.option("--worker-links", help=bench_plan.LINKS_HELP)
@click.option("--global-batch", type=click.IntRange(1), help="with --plan: samples per iteration [16 x workers]")
@click.option(
    "--plan-budget-s",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="with --plan auto: the planner's search budget",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench-results"),
    show_default=True,
)
def command(
    model: str,
    workers: int,
    bandwidth: str,
    delay: float,
    jitter: float,
    loss: float,
    policies: str,
    iters: int,
    warmup: int,
    repeats: int,
    batch: int,
    threads: int,
    seed: int,
    comm_timeout: float,
    knobs: tuple[tuple[str, str, Any], ...],
    ddp_grid: bool,
    no_references: bool,
    no_probe: bool,
    pin_cores: bool,
    validate: bool,
    mtu: int,
    isolation: str,
    plan: str | None,
    worker_cpu: str | None,
    worker_links: str | None,
    global_batch: int | None,
    plan_budget_s: float,
    out_dir: Path,
) -> None:
    """Train for real on an emulated cluster on this machine and compare policies with PyTorch DDP.

    Each worker runs in its own network namespace, linked to a bridge by a veth
    pair shaped with tc (needs root; without it, plain local processes, unshaped).
    Prints one table per link shaping and writes bench.json (every iteration time),
    bench.png and one Chrome trace per policy to --out.

    Every session also runs the DDP grid: DistributedDataParallel with
    bucket_cap_mb 1, 4, 25 × find_unused_parameters False, True, named
    ddp[25MiB], ddp[4MiB,find_unused], ... (torch_ddp is 25 MiB with
    find_unused_parameters=True, the reference of the parameter check). Each
    policy's speed-up is given against default DDP (ddp[25MiB], PyTorch's
    defaults) and best DDP (the fastest of the grid in that session).

    \b
        sudo commsched bench --model resnet5m --workers 4 --bandwidth none,1gbit,300mbit

    With --validate, each session first calibrates the simulator on the
    testbed (collective sweep on the shaped links, per-layer compute profile
    with the ranks sharing the CPUs) and the output ends with predicted vs
    measured iteration time per policy; the calibrated workload.json and
    cluster.yaml are saved so that `commsched compare --measured TRACE`
    can compare one policy task by task.

    With --plan, the testbed's workers differ (CPU share, link rate) and the
    run measures that plan against even DP and speed-proportional DP instead:

    \b
        sudo commsched bench --plan auto --model resnet5m
    """
    if plan is not None:
        if mtu != 1500:
            raise click.BadParameter("--plan runs use 1500-byte links; leave --mtu out", param_hint="'--mtu'")
        if pin_cores:
            raise click.BadParameter("--plan sets each worker's CPU itself (--worker-cpu)", param_hint="'--pin-cores'")
        bench_plan.run(
            plan=plan,
            model=model,
            worker_cpu=worker_cpu,
            worker_links=worker_links,
            global_batch=global_batch,
            budget_s=plan_budget_s,
            iters=iters,
            warmup=warmup,
            repeats=repeats,
            threads=threads,
            seed=seed,
            comm_timeout=comm_timeout,
            out_dir=out_dir,
        )
        return
    try:
        shapes = tuple(
            LinkShape(rate_bps=parse_rate(b), delay_ms=delay, jitter_ms=jitter, loss_pct=loss)
            for b in bandwidth.split(",")
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--bandwidth/--delay/--jitter/--loss") from None
    _refuse_what_cannot_be_built(shapes, isolation)
    chosen = tuple(p.strip() for p in policies.split(",") if p.strip())
    unknown = [p for p in chosen if p not in RUNTIME_POLICIES]
    if unknown:
        raise click.BadParameter(
            f"unknown {', '.join(unknown)}; known: {', '.join(RUNTIME_POLICIES)}", param_hint="--policies"
        )
    try:
        knob_map = knobs_by_policy(knobs, [p for p in chosen if p != TORCH_DDP])
    except ScheduleError as exc:
        raise click.BadParameter(str(exc), param_hint="--knob") from None
    try:
        config = BenchConfig(
            model=model,
            workers=workers,
            shapes=shapes,
            policies=chosen,
            iters=iters,
            warmup=warmup,
            repeats=repeats,
            batch=batch,
            threads=threads,
            seed=seed,
            comm_timeout_s=comm_timeout,
            references=not no_references,
            ddp_grid=ddp_grid,
            probe=not no_probe,
            pin_cores=pin_cores,
            validate=validate,
            isolation=isolation,  # type: ignore[arg-type]
            mtu_bytes=mtu,
            knobs=knob_map,
        )
    except ValueError as exc:  # "field: problem"; the fields are named after the options
        field, _, problem = str(exc).partition(": ")
        option = f"--{field.replace('_', '-')}"
        if any(option in param.opts for param in click.get_current_context().command.params):
            raise click.BadParameter(problem, param_hint=f"'{option}'") from None
        raise click.UsageError(str(exc)) from None
    console = Console(width=None if sys.stdout.isatty() else 130)
    for note in config.notes():
        console.print(f"[yellow]note:[/yellow] {note}", soft_wrap=True)
    with progress(console) as bar:
        report = run_bench(
            config,
            out_dir,
            command_line=shlex.join(["commsched", *sys.argv[1:]]),
            log=lambda message: console.print(message, markup=False, highlight=False),
            progress=bar,
        )
    meta = report["meta"]
    m = meta["machine"]
    console.print(
        f"{m['cpu_model']}, {m['cpus']} CPUs, torch {m['torch']}; {meta['testbed']['description']}; "
        f"{meta['model_parameters']:,} parameters ({meta['gradient_mib']:.1f} MiB of gradients); "
        f"iteration time = the slowest rank's mean over {iters} timed steps, median over {repeats} repeats; "
        + (
            f"default DDP = {DEFAULT_DDP.name}, best DDP = the fastest of the DDP grid"
            if ddp_grid
            else "DDP grid off (--no-ddp-grid): default DDP measured, no best DDP row"
        ),
        highlight=False,
    )
    for session in report["sessions"]:
        console.print(session_table(report, session))
        grid = grid_table(report, session)
        if grid is not None:
            console.print(grid)
        versus = auto_vs_best(session)
        if versus is not None:
            console.print(f"{shaping(session)}: {versus.describe()}", highlight=False)
    if validate:
        console.print(validation_table(report))
    plot(report, out_dir / "bench.png")
    traces = sum(len(s["traces"]) for s in report["sessions"])
    console.print(f"wrote {out_dir / 'bench.json'}, {out_dir / 'bench.png'} and {traces} traces")
