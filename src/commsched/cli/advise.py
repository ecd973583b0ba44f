"""``commsched advise``: which lossless policy, with which knobs, is fastest for a model on a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from commsched.cli.inputs import SIM_HELP, OutputFile, load_workload, parse_sim_options
from commsched.cli.progress import progress
from commsched.cluster import load_cluster
from commsched.plan.advise import Advice, advise
from commsched.plan.search import simulate_candidate
from commsched.sim.plot import plot_timeline


def _knobs_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in knobs.items()) or "defaults"


def advice_table(advice: Advice) -> Table:
    table = Table(title=f"advise · {advice.model} · {advice.cluster}")
    table.add_column("#", justify="right")
    table.add_column("policy")
    table.add_column("iter ms", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("vs best", justify="right")
    table.add_column("exposed ms", justify="right")
    table.add_column("trials", justify="right")
    table.add_column("knobs (changed from defaults)")
    best = advice.winner.iteration_ms
    for i, c in enumerate(advice.candidates, 1):
        table.add_row(
            str(i),
            c.policy,
            f"{c.iteration_ms:.2f}",
            f"{c.samples_per_s:,.0f}",
            f"{c.iteration_ms / best:.2f}x",
            f"{c.result.exposed_comm_ms:.2f}",
            str(c.trials),
            _knobs_text(c.changed_knobs),
        )
    bound = advice.ideal
    table.add_row("", "ideal (bound)", f"{bound.iteration_ms:.2f}", f"{bound.samples_per_s:,.0f}", "", "", "", "")
    return table


@click.command(name="advise", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", required=True, help="Zoo model name (e.g. resnet50) or a Workload JSON file.")
@click.option("--cluster", "-c", required=True, help="Cluster preset (e.g. 64xV100-10GbE) or a YAML file.")
@click.option("--budget-s", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option(
    "--trials", default=30, show_default=True, type=click.IntRange(1), help="Knob trials per policy, at most."
)
@click.option("--seed", default=0, show_default=True, help="Seed of the knob search.")
@click.option("--sim", "sim_pairs", multiple=True, metavar="KEY=VALUE", help=SIM_HELP)
@click.option("--plot", "plot_path", type=OutputFile(), help="Write a timeline PNG of the winner here.")
@click.option(
    "--save-plan", "plan_path", type=OutputFile(), help="Write the winner's plan (JSON) for parallelize(plan=PATH)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
def command(
    model: str,
    cluster: str,
    budget_s: float,
    trials: int,
    seed: int,
    sim_pairs: tuple[str, ...],
    plot_path: Path | None,
    plan_path: Path | None,
    as_json: bool,
) -> None:
    """Rank every lossless policy, its knobs searched by simulation, for MODEL on CLUSTER.

    \b
    Example:
      commsched advise -m resnet50 -c 8xV100-10GbE --plot winner.png
      commsched advise -m bert_large -c 64xV100-10GbE --budget-s 10 --json
    """
    sim_options = parse_sim_options(sim_pairs)
    workload = load_workload(model)
    spec = load_cluster(cluster)
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task(f"advise: {workload.model} on {spec.name}", total=None)
        result = advise(
            workload,
            spec,
            budget_s=budget_s,
            sim_options=sim_options,
            seed=seed,
            trials=trials,
            progress=lambda what, done: bar.update(task, completed=done),
        )
    if plan_path:
        result.plan.save(plan_path)
    if plot_path:
        w = result.winner
        traced = simulate_candidate(
            workload, spec, w.policy, w.knobs, sync=w.sync, options=sim_options, iterations=3, warmup=1, trace=True
        )
        assert traced.trace is not None
        plot_timeline(traced.trace, plot_path)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
        return
    console = Console()
    console.print(advice_table(result))
    console.print(f"[bold]winner[/bold]: {result.winner.policy}")
    console.print(result.parallelize_call(), markup=False, highlight=False)
    cut = " (budget reached: the knob search stopped early)" if result.budget_exhausted else ""
    console.print(f"search: {result.simulations} simulations in {result.search_s:.2f} s of {budget_s:g} s{cut}")
    for path, what in ((plan_path, "plan"), (plot_path, "timeline")):
        if path:
            console.print(f"{what} written to {path}")
