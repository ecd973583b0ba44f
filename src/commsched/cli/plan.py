"""``commsched plan``: a heterogeneous-cluster plan (per-rank batches, per-bucket sync, policy) and its baselines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from commsched.cli.inputs import SIM_HELP, OutputFile, load_workload, parse_sim_options
from commsched.cli.plan_stages import print_staged
from commsched.cli.progress import progress
from commsched.cli.simulate import format_bytes
from commsched.cluster import load_cluster
from commsched.plan.hetero import HeteroPlan
from commsched.plan.memory import MemoryModel
from commsched.plan.staged import StagedPlan, plan_deployment
from commsched.schedule import LOSSLESS
from commsched.units import MiB


def _batches(batch_sizes: tuple[int, ...]) -> str:
    """``84×2 61×4 50×2``: runs of equal batches in rank order (``--json`` lists each rank)."""
    runs: list[list[int]] = []
    for b in batch_sizes:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return " ".join(f"{b}×{k}" if k > 1 else str(b) for b, k in runs)


def _transports(plan: HeteroPlan) -> str:
    """What the plan's tasks are sent by: ``collective``, ``ps`` or ``collective+ps``."""
    return "+".join(sorted(set(plan.transports)))


def plans_table(plan: HeteroPlan) -> Table:
    table = Table(title=f"plan · {plan.model} · {plan.cluster} · global batch {plan.global_batch}")
    for column in ("plan", "policy", "sent by", "iter ms", "samples/s", "speed-up", "fits", "per-rank batch"):
        table.add_column(column, justify="right" if column in ("iter ms", "samples/s", "speed-up") else "left")
    even = plan.baseline("even_allreduce").iteration_ms
    table.add_row(
        f"[bold]chosen ({plan.chosen})[/bold]",
        plan.policy,
        _transports(plan),
        f"{plan.iteration_ms:.2f}",
        f"{plan.samples_per_s:,.0f}",
        f"{even / plan.iteration_ms:.2f}x",
        "yes",
        _batches(plan.batch_sizes),
    )
    for b in plan.baselines:
        fits = "yes" if b.fits else f"no: {b.memory_note}"
        table.add_row(
            b.name,
            "ddp",
            b.sync,
            f"{b.iteration_ms:.2f}",
            f"{b.samples_per_s:,.0f}",
            f"{even / b.iteration_ms:.2f}x",
            fits,
            _batches(b.batch_sizes),
        )
    return table


def ranks_table(plan: HeteroPlan) -> Table:
    table = Table(title="per rank")
    for column in ("rank", "device", "node", "batch", "gradient weight", "memory used / usable"):
        table.add_column(column, justify="left" if column in ("device", "node") else "right")
    for r in plan.ranks():
        table.add_row(
            str(r["rank"]),
            r["device"],
            r["node"],
            str(r["local_batch"]),
            f"{r['gradient_weight']:.4f}",
            f"{format_bytes(r['memory_used_bytes'])} / {format_bytes(r['memory_usable_bytes'])}",
        )
    return table


def buckets_table(plan: HeteroPlan) -> Table:
    """Sync per bucket, consecutive buckets of the same transport on one row (``--json`` lists each)."""
    table = Table(title="sync per bucket")
    for column in ("tasks", "first", "last", "kinds", "bytes", "transport"):
        table.add_column(column)
    tasks = plan.plan.tasks
    runs: list[list[int]] = []
    for t in tasks:
        if runs and tasks[runs[-1][-1]].transport == t.transport:
            runs[-1].append(t.id)
        else:
            runs.append([t.id])
    for run in runs:
        first, last = tasks[run[0]], tasks[run[-1]]
        kinds = ", ".join(sorted({tasks[i].kind for i in run}))
        span = f"{run[0]}" if len(run) == 1 else f"{run[0]}-{run[-1]}"
        nbytes = sum(tasks[i].bytes for i in run)
        table.add_row(span, first.name, last.name, kinds, format_bytes(nbytes), first.transport)
    return table


@click.command(name="plan", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", required=True, help="Zoo model name (e.g. vgg19) or a Workload JSON file.")
@click.option("--cluster", "-c", required=True, help="Cluster preset (e.g. hetero-8) or a YAML file.")
@click.option("--global-batch", type=click.IntRange(1), help="Samples per iteration over all ranks [batch x ranks].")
@click.option("--budget-s", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--memory-margin", default=0.1, show_default=True, type=click.FloatRange(0, 1, max_open=True))
@click.option(
    "--activation-mb-per-sample",
    type=click.FloatRange(min=0),
    help="Activation memory per sample, MiB (default: the workload's record; none: not modelled).",
)
@click.option(
    "--optimizer-states", default=2.0, show_default=True, type=click.FloatRange(min=0), help="Adam 2, SGD+momentum 1."
)
@click.option(
    "--micro-batch",
    type=click.IntRange(1),
    help="Every rank's batch a multiple of it, accumulated in equal micro-batches (BatchNorm alike on every rank).",
)
@click.option(
    "--stages/--no-stages",
    default=True,
    show_default=True,
    help="Place layer ranges on devices (pipeline stages) when data parallelism does not fit in memory.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the knob search.")
@click.option(
    "--policies",
    "policy_list",
    metavar="P1,P2,...",
    help="Search only these lossless policies (comma list) [every lossless policy].",
)
@click.option("--sim", "sim_pairs", multiple=True, metavar="KEY=VALUE", help=SIM_HELP)
@click.option(
    "--out",
    "-o",
    "out_path",
    type=OutputFile(),
    help="Write the CommPlan here (JSON, per-rank batches included): parallelize(model, opt, plan=PATH).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
def command(
    model: str,
    cluster: str,
    global_batch: int | None,
    budget_s: float,
    memory_margin: float,
    activation_mb_per_sample: float | None,
    optimizer_states: float,
    micro_batch: int | None,
    stages: bool,
    seed: int,
    policy_list: str | None,
    sim_pairs: tuple[str, ...],
    out_path: Path | None,
    as_json: bool,
) -> None:
    """Plan data-parallel training of MODEL on a heterogeneous CLUSTER: per-rank batches, sync per bucket,
    policy and knobs, each candidate scored by simulation, beside even and speed-proportional DP.

    \b
    Example:
      commsched plan -m vgg19 -c hetero-8
      commsched plan -m bert_large -c hetero-8 --activation-mb-per-sample 300 -o plan.json

    When a device cannot hold the model (or the batch does not fit), data
    parallelism is refused, naming the device and the shortfall, and layer
    ranges are placed on chains of devices instead (pipeline stages;
    --no-stages to stop there).
    """
    sim_options = parse_sim_options(sim_pairs)
    policies = None
    if policy_list:
        policies = [p.strip() for p in policy_list.split(",") if p.strip()]
        unknown = [p for p in policies if p not in LOSSLESS]
        if unknown or not policies:
            raise click.BadParameter(
                f"not lossless policies: {', '.join(unknown) or '(none given)'}; known: {', '.join(sorted(LOSSLESS))}",
                param_hint="'--policies'",
            )
    workload = load_workload(model)
    spec = load_cluster(cluster)
    activation = None if activation_mb_per_sample is None else activation_mb_per_sample * MiB
    memory = MemoryModel(optimizer_states=optimizer_states, activation_bytes_per_sample=activation)
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task(f"plan: {workload.model} on {spec.name}", total=None)
        result = plan_deployment(
            workload,
            spec,
            global_batch=global_batch,
            budget_s=budget_s,
            memory_margin=memory_margin,
            memory=memory,
            stages=stages,
            sim_options=sim_options,
            seed=seed,
            micro_batch=micro_batch,
            policies=policies,
            progress=lambda what, done: bar.update(task, completed=done),
        )
    written = result.save(out_path) if out_path else None
    if as_json:
        data = result.to_dict()
        if written:
            data["written"] = {"plan": str(written)}
        click.echo(json.dumps(data, indent=1, default=str))
        return
    console = Console(width=None if sys.stdout.isatty() else 150)  # piped: whole rows, not 80 columns
    if isinstance(result, StagedPlan):
        print_staged(console, result, written)
        return
    console.print(plans_table(result))
    console.print(ranks_table(result))
    console.print(buckets_table(result))
    knobs = ", ".join(f"{k}={v}" for k, v in result.knobs.items()) or "-"
    console.print(f"policy {result.policy}, knobs {knobs}")
    reached = "; the budget cut the search short" if result.budget_exhausted else ""
    console.print(
        f"search: {result.splits_screened} splits screened, {result.splits_searched} searched, "
        f"{result.simulations} simulations in {result.search_s:.2f} s (budget {budget_s:g} s{reached})"
    )
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    if written:
        console.print(f"plan written to {written} (per-rank batches included): parallelize(model, opt, plan=...)")
