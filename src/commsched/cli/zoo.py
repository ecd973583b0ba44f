"""``commsched zoo``: list the built-in models, show one model's workload."""

from __future__ import annotations

import json

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched import zoo
from commsched.errors import SpecError
from commsched.workload import Workload


@click.group(name="zoo", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Built-in model workloads: layers, tensors and compute times of well-known models."""


@command.command(name="list")
def list_command() -> None:
    """List the zoo's models with their size and default-profile compute times."""
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("model", "params", "tensors", "layers", "batch", "devices", "fwd ms", "bwd ms"):
        table.add_column(column, justify="left" if column in ("model", "devices") else "right", no_wrap=True)
    table.columns[0].style = "bold"
    for name in zoo.list_models():
        w = zoo.load(name)
        table.add_row(
            name,
            f"{w.num_params / 1e6:.1f}M",
            str(len(w.tensors)),
            str(len(w.layers)),
            str(w.batch_size),
            ", ".join(zoo.available_devices(name)),
            f"{w.forward_ms:.1f}",
            f"{w.backward_ms:.1f}",
        )
    table.caption = f"times: default profile ({zoo.DEFAULT_DEVICE}); `commsched zoo show MODEL` says how they were made"
    Console().print(table)


@command.command(name="show")
@click.argument("name")
@click.option(
    "--device", default=None, metavar="DEV", help="Profile to show, e.g. V100 (default: the model's default)."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the workload JSON, with an added top-level integer num_params (drop it before loading the file "
    "back as a workload).",
)
def show_command(name: str, device: str | None, as_json: bool) -> None:
    """Show zoo model NAME: batch, size, compute times, where the numbers came from, its largest layers."""
    workload = _load(name, device)
    if as_json:
        data = {"num_params": workload.num_params, **json.loads(workload.to_json())}
        click.echo(json.dumps(data, indent=1))
        return
    _summary(workload, zoo.available_devices(name))


def _load(name: str, device: str | None) -> Workload:
    try:
        return zoo.load(name, device)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None


def _summary(w: Workload, devices: list[str]) -> None:
    console = Console()
    p = w.provenance
    console.print(
        f"[bold]{w.model}[/bold]  batch {w.batch_size} on {w.device} ({w.dtype}); profiles: {', '.join(devices)}"
    )
    console.print(
        f"{w.num_params:,} parameters ({w.total_bytes / 2**20:.1f} MiB of gradients) "
        f"in {len(w.tensors)} tensors, {len(w.layers)} layers"
    )
    console.print(
        f"forward {w.forward_ms:.1f} ms, backward {w.backward_ms:.1f} ms, "
        f"iteration without communication {w.forward_ms + w.backward_ms:.1f} ms"
    )
    console.print(f"{p.kind} on {p.source}: {p.method}", highlight=False)
    if p.notes:
        console.print(p.notes, highlight=False)

    table = Table(box=box.SIMPLE_HEAD, title="largest layers (by backward time)")
    table.add_column("#", justify="right")
    table.add_column("layer", no_wrap=True)
    table.add_column("params", justify="right")
    table.add_column("fwd ms", justify="right")
    table.add_column("bwd ms", justify="right")
    top = sorted(range(len(w.layers)), key=lambda i: w.layers[i].backward_ms, reverse=True)[:8]
    for i in sorted(top):
        layer = w.layers[i]
        table.add_row(str(i), layer.name, f"{layer.numel:,}", f"{layer.forward_ms:.2f}", f"{layer.backward_ms:.2f}")
    console.print(table)
