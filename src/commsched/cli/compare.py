"""``commsched compare``: every policy on one model and cluster, beside the ideal lower bound."""

from __future__ import annotations

import json
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
from commsched.errors import CommschedError, ScheduleError
from commsched.plan.advise import overlap_bound
from commsched.schedule import POLICIES
from commsched.sim import SimResult, simulate
from commsched.sim.options import SimOptions
from commsched.sim.packet import PacketConfig
from commsched.sim.packet.options import changed_settings
from commsched.sim.packet.run import simulate_packet
from commsched.sim.plot import plot_bars

#: Table order: the baselines first, then the schedulers.
ORDER = ("no_overlap", "ddp", "wfbp", "horovod", "bytescheduler", "prophet", "dear")


def _policies(given: tuple[str, ...]) -> list[str]:
    names = [p.strip() for item in given for p in item.split(",") if p.strip()]
    if not names:
        return [p for p in ORDER if p in POLICIES] + sorted(set(POLICIES) - set(ORDER))
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise ScheduleError(f"policy: unknown policy {unknown[0]!r}; known: {', '.join(sorted(POLICIES))}")
    return list(dict.fromkeys(names))


@click.command(name="compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", required=True, help="Zoo model name (e.g. resnet50) or a Workload JSON file.")
@click.option("--cluster", "-c", required=True, help="Cluster preset (e.g. 64xV100-10GbE) or a YAML file.")
@click.option(
    "--policies",
    "-p",
    multiple=True,
    metavar="P[,P...]",
    help="Policies to compare (repeatable or comma-separated; default all).",
)
@click.option("--iterations", "-n", default=20, show_default=True, type=click.IntRange(1), help="Measured iterations.")
@click.option(
    "--warmup", default=3, show_default=True, type=click.IntRange(0), help="Iterations simulated first, not measured."
)
@click.option("--knob", "-k", "knob_values", multiple=True, type=KnobAssignment(), help=KNOB_HELP)
@click.option("--sim", "sim_pairs", multiple=True, metavar="KEY=VALUE", help=SIM_HELP + "; for every policy")
@click.option("--packet", "packet_values", multiple=True, type=PacketAssignment(), help=PACKET_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of a table.")
@click.option("--plot", "plot_path", type=OutputFile(), help="Write a bar chart PNG of iteration times here.")
@click.option(
    "--measured",
    type=click.Path(exists=True, dir_okay=False),
    help="A runtime trace (parallelize(..., trace=True)) of ONE policy: compare it with the prediction task by task.",
)
@click.option(
    "--skip-measured",
    default=2,
    show_default=True,
    type=click.IntRange(0),
    help="With --measured: leading measured iterations to ignore (the runtime's warm-up).",
)
def command(
    model: str,
    cluster: str,
    policies: tuple[str, ...],
    iterations: int,
    warmup: int,
    knob_values: tuple[tuple[str, str, Any], ...],
    sim_pairs: tuple[str, ...],
    packet_values: tuple[tuple[str, Any], ...],
    as_json: bool,
    plot_path: Path | None,
    measured: str | None,
    skip_measured: int,
) -> None:
    """Simulate every policy on MODEL and CLUSTER; print iteration time, throughput, speed-up vs ddp.

    The `ideal` row is a lower bound no schedule beats under the same cost
    model (fluid preemptive priority, see docs/simulator.md); where a policy
    runs on the parameter server, the lower of the collective's and the
    parameter server's bound.

    \b
    Example:
      commsched compare -m resnet50 -c 64xV100-10GbE --plot bars.png
      commsched compare -m bert_large -c 64xV100-100GbIB -p ddp,dear -k dear.threshold_mb=50
      commsched compare -m resnet18 -c 8xV100-10GbE -p ddp,dear --sim network=packet --packet transport=dctcp
    """
    sim_options = parse_sim_options(sim_pairs)
    packet = packet_settings(packet_values, sim_options)
    workload = load_workload(model)
    spec = load_cluster(cluster)
    names = _policies(policies)
    given = knobs_by_policy(knob_values, names)
    knobs = {p: given.get(p, {}) for p in names}
    if measured is not None:
        _compare_measured(
            workload, spec, names, knobs, sim_options, packet, iterations, warmup, measured, skip_measured
        )
        return
    results: dict[str, SimResult | str] = {}
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task("compare", total=len(names))
        for policy in names:
            bar.update(task, description=f"compare: {policy}")
            try:
                results[policy] = _simulate(
                    workload, spec, policy, iterations, warmup, sim_options, packet, False, knobs[policy]
                )
            except CommschedError as exc:
                results[policy] = str(exc)
            bar.update(task, advance=1)
    ok = {p: r for p, r in results.items() if isinstance(r, SimResult)}
    bound = overlap_bound(workload, spec, sim_options, [(p, knobs[p]) for p in ok])
    base = ok["ddp"].iteration_ms if "ddp" in ok else None
    if plot_path:
        rows = [(p, r.iteration_ms) for p, r in ok.items()]
        plot_bars(rows, plot_path, f"{workload.model} on {spec.name}", ideal_ms=bound.iteration_ms)
    if as_json:
        data = {
            "packet": changed_settings(packet) if packet is not None else None,
            "model": workload.model,
            "cluster": spec.name,
            "results": {p: (r.to_dict() if isinstance(r, SimResult) else {"error": r}) for p, r in results.items()},
            "ideal": bound.to_dict(),
        }
        click.echo(json.dumps(data, indent=1, default=str))
        return
    table = Table(title=f"{workload.model} (batch {workload.batch_size}) on {spec.name}, {spec.num_workers} workers")
    table.caption = "exposed: iteration minus compute; tasks: collectives per iteration"
    table.add_column("policy", no_wrap=True)
    for name in ("iter ms", "samples/s", "vs ddp", "exposed ms", "GPU busy", "tasks"):
        table.add_column(name, justify="right", no_wrap=True)
    for policy, r in results.items():
        if isinstance(r, str):
            table.add_row(policy, "[red]failed[/red]", "", "", "", "", "")
            continue
        speedup = f"{base / r.iteration_ms:.2f}x" if base else "-"
        table.add_row(
            policy + (" *" if r.unvalidated else ""),
            f"{r.iteration_ms:.1f}",
            f"{r.samples_per_s:,.0f}",
            speedup,
            f"{r.exposed_comm_ms:.1f}",
            f"{r.gpu_busy:.0%}",
            str(r.num_tasks),
        )
    speedup = f"{base / bound.iteration_ms:.2f}x" if base else "-"
    table.add_row(
        "[italic]ideal[/italic]",
        f"{bound.iteration_ms:.1f}",
        f"{bound.samples_per_s:,.0f}",
        speedup,
        f"{bound.exposed_comm_ms:.1f}",
        f"{bound.compute_ms / bound.iteration_ms:.0%}",
        "",
        style="dim",
    )
    console = Console()
    console.print(table)
    opts = SimOptions.from_mapping(sim_options)
    console.print(
        f"compute {bound.compute_ms:.1f} ms/iteration (slowest worker), "
        f"all-reduce transfer {bound.transfer_ms:.1f} ms; "
        f"simulator: algorithm={opts.algorithm}, max_concurrent={opts.max_concurrent}, network={opts.network}"
        + (f" ({_settings(packet)})" if packet is not None else "")
        + f"; median of {iterations} iterations after {warmup} warm-up",
        soft_wrap=True,
    )
    for policy, r in results.items():
        if isinstance(r, str):
            console.print(f"[red]{policy} failed:[/red] {r}", soft_wrap=True)
        elif r.unvalidated:
            console.print(f"* {policy}: unvalidated: {r.unvalidated}", soft_wrap=True)
    if plot_path:
        console.print(f"bar chart written to {plot_path}")


def _settings(packet: PacketConfig) -> str:
    return ", ".join(f"{k}={v}" for k, v in changed_settings(packet).items()) or "default packet settings"


def _simulate(
    workload: Any,
    spec: Any,
    policy: str,
    iterations: int,
    warmup: int,
    options: SimOptions | dict[str, Any],
    packet: PacketConfig | None,
    trace: bool,
    knobs: dict[str, Any],
) -> SimResult:
    """One policy's prediction, on the packet network ``packet`` describes when given."""
    if packet is None:
        return simulate(workload, spec, policy, iterations, warmup, options=options, trace=trace, **knobs)
    run = simulate_packet(workload, spec, policy, packet, iterations, warmup, options=options, trace=trace, **knobs)
    return run.result


def _compare_measured(
    workload: Any,
    spec: Any,
    names: list[str],
    knobs: dict[str, dict[str, Any]],
    sim_options: dict[str, Any],
    packet: PacketConfig | None,
    iterations: int,
    warmup: int,
    measured_path: str,
    skip_measured: int,
) -> None:
    """Predicted vs measured for one policy: per task, then per iteration."""
    from commsched.cli.compare_trace import comparison_summary, comparison_table, require_common_tasks
    from commsched.plan.gloo import gloo_options
    from commsched.trace import Trace
    from commsched.trace.compare import compare_traces, trace_iteration_ms

    if len(names) != 1:
        raise click.UsageError("--measured compares one policy: give exactly one with --policies")
    policy = names[0]
    options = sim_options or gloo_options(workload, spec, policy, **knobs[policy])
    result = _simulate(workload, spec, policy, iterations, warmup, options, packet, True, knobs[policy])
    assert result.trace is not None
    measured = Trace.load(measured_path)
    rows = compare_traces(result.trace, measured, skip_predicted=warmup, skip_measured=skip_measured)
    require_common_tasks(rows, skip_measured)
    console = Console()
    console.print(comparison_table(rows, f"{policy}: predicted ({spec.name}) vs measured ({measured_path})"))
    console.print(
        comparison_summary(rows, result.iteration_ms, trace_iteration_ms(measured, skip=skip_measured)),
        soft_wrap=True,
    )
