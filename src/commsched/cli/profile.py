"""``commsched profile``: measure a model layer by layer; its subcommands measure the network and compare traces.

The models it builds are :mod:`commsched.cli.profile_models`; ``profile network``
is :mod:`commsched.cli.profile_network`, ``profile compare-trace``
:mod:`commsched.cli.compare_trace`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched.cli.compare_trace import compare_trace_command
from commsched.cli.inputs import OutputFile
from commsched.cli.profile_models import build, model_names
from commsched.cli.profile_network import network_command
from commsched.cli.progress import progress

_SETTINGS = {"help_option_names": ["-h", "--help"]}


@click.group(name="profile", invoke_without_command=True, context_settings=_SETTINGS)
@click.option("--model", "-m", "model_name", metavar="NAME", help="Model to build and profile (see --list).")
@click.option("--batch", "-b", "batch_size", type=click.IntRange(1), help="Batch size (per worker).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True, help="bf16: autocast.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--repeats", "-r", type=click.IntRange(1), default=10, show_default=True, help="Timed iterations.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed iterations first.")
@click.option("--threads", type=click.IntRange(1), help="torch.set_num_threads (default: torch's choice).")
@click.option("--seed", type=int, default=0, show_default=True, help="Weights and synthetic batch.")
@click.option("--out", "-o", type=OutputFile(), help="Write the Workload JSON here.")
@click.option("--list", "list_models", is_flag=True, help="List the models that can be profiled here.")
@click.pass_context
def command(
    ctx: click.Context,
    model_name: str | None,
    batch_size: int | None,
    dtype: str,
    device: str,
    repeats: int,
    warmup: int,
    threads: int | None,
    seed: int,
    out: Path | None,
    list_models: bool,
) -> None:
    """Measure per-layer forward/backward and gradient-ready times of a model (a Workload JSON).

    \b
    Examples:
      commsched profile --model resnet5m --batch 8 --out resnet5m.cpu.json
      commsched profile --model cnn --batch 32 --dtype bf16 --repeats 20
      commsched profile network --world 2          # the network's alpha-beta
      commsched profile compare-trace --predicted sim.json --measured run.json

    The table lists each layer's median forward and backward time, when its
    last gradient is ready (ms from the start of backward) and its parameters;
    the last line compares the sum of layer times with a whole iteration
    measured without hooks. See docs/profiling.md.
    """
    if ctx.invoked_subcommand is not None:
        if model_name is not None or batch_size is not None:
            raise click.UsageError("--model/--batch profile a model; leave them out with a subcommand")
        return
    console = Console()
    if list_models:
        for name in model_names():
            console.print(name)
        return
    if model_name is None or batch_size is None:
        raise click.UsageError("give --model NAME and --batch B (or a subcommand: network, compare-trace)")

    import torch

    from commsched.profile import iteration_check, profile_model, zoo_filename

    if threads is not None:
        torch.set_num_threads(threads)
    model, make_batch, loss_fn = build(model_name, batch_size, seed)
    model.to(device)
    model.train()
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task(f"profiling {model_name} (batch {batch_size}, {dtype}, {device})", total=1)

        def step(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        workload = profile_model(
            model,
            make_batch,
            loss_fn,
            batch_size=batch_size,
            model_name=model_name,
            device=device,
            dtype=dtype,
            warmup=warmup,
            repeats=repeats,
            command=shlex.join(["commsched", *sys.argv[1:]]),
            progress=step,
        )
    console.print(workload_table(workload))
    check = iteration_check(workload)
    console.print(
        f"sum of layers {check.layer_sum_ms:.2f} ms; whole iteration without hooks {check.iteration_ms:.2f} ms "
        f"(ratio {check.ratio:.3f}, {'ok' if check.ok() else 'off by more than 20 %'}); "
        f"with hooks {check.profiled_iteration_ms:.2f} ms"
    )
    console.print(f"[dim]{workload.provenance.source}; {workload.provenance.method}[/dim]")
    if out is not None:
        workload.save(out)
        console.print(f"workload written to {out}")
    else:
        console.print(f"[dim]not written; --out {zoo_filename(workload)} would keep it[/dim]")


def workload_table(workload: Any) -> Table:
    table = Table(
        title=f"{workload.model}, batch {workload.batch_size}, {workload.dtype} on {workload.device}",
        box=box.SIMPLE_HEAD,
    )
    for column in ("#", "layer", "fwd ms", "bwd ms", "ready ms", "params"):
        table.add_column(column, justify="left" if column == "layer" else "right", no_wrap=column != "layer")
    for i, layer in enumerate(workload.layers):
        ready = f"{max(layer.grad_ready_ms):.2f}" if layer.grad_ready_ms else "-"
        table.add_row(
            str(i), layer.name, f"{layer.forward_ms:.3f}", f"{layer.backward_ms:.3f}", ready, f"{layer.numel:,}"
        )
    total = (f"{workload.forward_ms:.2f}", f"{workload.backward_ms:.2f}", "", f"{workload.num_params:,}")
    table.add_row("", "[bold]total[/bold]", *total)
    table.caption = "ready: when the layer's last gradient is final, from the start of backward"
    return table


command.add_command(network_command)
command.add_command(compare_trace_command)
