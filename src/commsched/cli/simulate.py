"""``commsched simulate``: predict one policy's iteration time on a cluster, optionally tune its knobs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from commsched.cli.inputs import (
    KNOB_HELP,
    PACKET_HELP,
    SIM_HELP,
    KnobAssignment,
    OutputFile,
    PacketAssignment,
    knobs_by_policy,
    load_workload,
    packet_settings,
    parse_sim_options,
)
from commsched.cli.progress import progress
from commsched.cluster import load_cluster
from commsched.schedule import POLICIES
from commsched.sim import SimResult, simulate
from commsched.sim.packet.options import changed_settings
from commsched.sim.packet.run import PacketRun, simulate_packet
from commsched.sim.plot import plot_timeline


def format_bytes(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def result_table(result: SimResult, title: str, packet: PacketRun | None = None) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    each = result.iteration_ms_each
    table.add_row("iteration", f"{result.iteration_ms:.2f} ms (min {min(each):.2f}, max {max(each):.2f})")
    table.add_row("throughput", f"{result.samples_per_s:,.0f} samples/s")
    table.add_row("compute (slowest worker)", f"{result.compute_ms:.2f} ms")
    table.add_row("exposed communication", f"{result.exposed_comm_ms:.2f} ms")
    table.add_row("GPU busy", f"{result.gpu_busy:.1%}")
    for name, util in result.link_utilisation.items():
        table.add_row(f"link busy ({name})", f"{util:.1%}")
    table.add_row("gradient bytes / iteration", format_bytes(result.gradient_bytes))
    table.add_row("sent per worker / iteration", format_bytes(result.sent_bytes_per_worker))
    table.add_row("collectives / iteration", str(result.num_tasks))
    knobs = ", ".join(f"{k}={_fmt(v)}" for k, v in result.knobs.items()) or "-"
    table.add_row("knobs", knobs)
    opts = result.options
    table.add_row(
        "simulator",
        f"algorithm={opts.algorithm}, max_concurrent={opts.max_concurrent}, update_ms={opts.update_ms:g}, "
        f"network={opts.network}",
    )
    if packet is not None:
        table.add_row("packet network", packet_summary(packet))
    classes = ", ".join(f"{len(c.ranks)} x speed {c.speed:g}" for c in result.classes)
    table.add_row("workers", f"{result.num_workers} ({classes})")
    table.add_row("events", f"{result.events:,} in {result.wall_s:.3f} s")
    return table


def packet_summary(run: PacketRun) -> str:
    """The packet settings that differ from the defaults, and what the connections saw."""
    changed = ", ".join(f"{k}={_fmt(v)}" for k, v in changed_settings(run.network.config).items()) or "defaults"
    stats = run.network.flow_stats()
    totals = {key: sum(int(row[key]) for row in stats) for key in ("drops", "marks", "retransmits", "timeouts")}
    return f"{changed}; " + ", ".join(f"{v:,} {k}" for k, v in totals.items())


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@click.command(name="simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", required=True, help="Zoo model name (e.g. resnet50) or a Workload JSON file.")
@click.option("--cluster", "-c", required=True, help="Cluster preset (e.g. 64xV100-10GbE) or a YAML file.")
@click.option("--policy", "-p", required=True, type=click.Choice(sorted(POLICIES)), help="Communication policy.")
@click.option("--iterations", "-n", default=20, show_default=True, type=click.IntRange(1), help="Measured iterations.")
@click.option(
    "--warmup", default=3, show_default=True, type=click.IntRange(0), help="Iterations simulated first, not measured."
)
@click.option("--knob", "-k", "knob_values", multiple=True, type=KnobAssignment(), help=KNOB_HELP)
@click.option("--sim", "sim_pairs", multiple=True, metavar="KEY=VALUE", help=SIM_HELP)
@click.option("--packet", "packet_values", multiple=True, type=PacketAssignment(), help=PACKET_HELP)
@click.option("--trace", "trace_path", type=OutputFile(), help="Write the Chrome/Perfetto trace JSON here.")
@click.option(
    "--save-plan",
    "plan_path",
    type=OutputFile(),
    help="Write the simulated plan here (JSON): parallelize(model, opt, plan=PATH) runs it.",
)
@click.option("--plot", "plot_path", type=OutputFile(), help="Write a timeline PNG of two iterations here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--tune", "do_tune", is_flag=True, help="Search the policy's numeric knobs by simulation (optuna).")
@click.option("--trials", default=30, show_default=True, type=click.IntRange(1), help="Trials for --tune.")
@click.option("--seed", default=0, show_default=True, help="Random seed for --tune.")
def command(
    model: str,
    cluster: str,
    policy: str,
    iterations: int,
    warmup: int,
    knob_values: tuple[tuple[str, str, Any], ...],
    sim_pairs: tuple[str, ...],
    packet_values: tuple[tuple[str, Any], ...],
    trace_path: Path | None,
    plan_path: Path | None,
    plot_path: Path | None,
    as_json: bool,
    do_tune: bool,
    trials: int,
    seed: int,
) -> None:
    """Simulate POLICY training MODEL on CLUSTER and report iteration time, throughput and utilisation.

    \b
    Example:
      commsched simulate -m resnet50 -c 64xV100-10GbE -p dear --plot dear.png
      commsched simulate -m bert_large -c 64xV100-100GbIB -p bytescheduler --tune
      commsched simulate -m vgg16 -c 8xV100-10GbE -p ddp -k ddp.bucket_cap_mb=50 --sim max_concurrent=2
      commsched simulate -m cnn.json -c 2workers.yaml -p dear --save-plan plan.json
      commsched simulate -m resnet18 -c 8xV100-10GbE -p dear --sim network=packet --packet transport=dctcp
    """
    knobs = knobs_by_policy(knob_values, [policy]).get(policy, {})
    sim_options = parse_sim_options(sim_pairs)
    packet = packet_settings(packet_values, sim_options)
    if packet is not None and do_tune:
        raise click.UsageError("--tune searches with the default packet settings: drop --packet or --tune")
    workload = load_workload(model)
    spec = load_cluster(cluster)
    tuned = None
    run: PacketRun | None = None
    if do_tune:
        from commsched.plan.tune import tune

        with progress(Console(stderr=True)) as bar:
            task = bar.add_task(f"tune {policy}: {trials} trials", total=trials)
            tuned = tune(
                workload,
                spec,
                policy,
                trials,
                iterations,
                warmup,
                seed,
                sim_options,
                progress=lambda done: bar.update(task, completed=done),
                **knobs,
            )
        result = tuned.best
    elif packet is not None:
        run = simulate_packet(workload, spec, policy, packet, iterations, warmup, options=sim_options, **knobs)
        result = run.result
    else:
        result = simulate(workload, spec, policy, iterations, warmup, options=sim_options, **knobs)
    if trace_path and run is not None:
        run.save_chrome(trace_path)  # with queue-depth counters and per-connection statistics
    elif trace_path and result.trace is not None:
        result.trace.save_chrome(trace_path)
    if plan_path and result.plan is not None:
        result.plan.save(plan_path)
    if plot_path and result.trace is not None:
        plot_timeline(result.trace, plot_path)
    if as_json:
        data: dict[str, Any] = {"result": result.to_dict()}
        if tuned is not None:
            data["tune"] = tuned.to_dict()
        if run is not None:
            data["packet"] = {"settings": asdict(run.network.config), "connections": run.network.flow_stats()}
        click.echo(json.dumps(data, indent=1, default=str))
        return
    console = Console()
    if tuned is not None:
        best = ", ".join(f"{k}={_fmt(v)}" for k, v in tuned.best_knobs.items()) or "the defaults"
        console.print(
            f"[bold]{policy}[/bold]: best of {tuned.trials} trials: {best}: "
            f"{tuned.best.iteration_ms:.2f} ms vs {tuned.default.iteration_ms:.2f} ms with the defaults "
            f"([bold]{tuned.gain:.2f}x[/bold])"
        )
    console.print(result_table(result, f"{policy} · {workload.model} · {spec.name}", run))
    for path, what in ((trace_path, "trace"), (plot_path, "timeline")):
        if path:
            console.print(f"{what} written to {path}")
