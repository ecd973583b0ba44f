"""``commsched cluster``: list the shipped presets, show a cluster spec."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched.cluster import Cluster, Device, Link, Node, list_presets, load_cluster
from commsched.errors import SpecError


@click.group(name="cluster", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Cluster specs: shipped presets and your own YAML files."""


@command.command(name="list")
def list_command() -> None:
    """List the shipped cluster presets with their descriptions."""
    table = Table(show_lines=True)
    table.add_column("preset", style="bold", no_wrap=True)
    table.add_column("workers", justify="right")
    table.add_column("description")
    for name in list_presets():
        cluster = _load(name)
        table.add_row(name, str(cluster.num_workers), cluster.description)
    Console().print(table)


@command.command(name="show")
@click.argument("spec", metavar="PRESET|FILE")
@click.option("--yaml", "as_yaml", is_flag=True, help="Print the validated spec as YAML instead of a table.")
def show_command(spec: str, as_yaml: bool) -> None:
    """Validate a cluster (a preset name or a YAML file) and show its nodes, devices, speeds and links."""
    cluster = _load(spec)
    if as_yaml:
        click.echo(cluster.to_yaml(), nl=False)
        return
    console = Console()
    console.print(f"[bold]{cluster.name}[/bold]: {cluster.description}" if cluster.description else cluster.name)
    console.print(_nodes_table(cluster))
    kind = "homogeneous" if cluster.is_homogeneous else "heterogeneous"
    console.print(
        f"{cluster.num_workers} workers on {cluster.num_nodes} nodes ({kind}); "
        f"slowest NIC {cluster.bottleneck_nic_gbps:g} Gbit/s; "
        f"slowest link on a ring over all workers {cluster.ring_bottleneck_gbps:g} Gbit/s"
    )
    if cluster.servers is not None:
        servers = cluster.servers
        where = "colocated with the first nodes" if servers.colocated else "dedicated"
        links = ", ".join(sorted({_link(link) for link in cluster.server_links}))
        console.print(f"{servers.count} parameter server(s), {where}: {links}")


def _load(spec: str) -> Cluster:
    try:
        return load_cluster(spec)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None


def _nodes_table(cluster: Cluster) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("node", style="bold", no_wrap=True)
    table.add_column("ranks", justify="right", no_wrap=True)
    table.add_column("devices", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("speed", justify="right", no_wrap=True)
    table.add_column("nic")
    table.add_column("intra")
    table.caption = "links: bandwidth, one-way latency + per-message overhead"
    first_rank = 0
    for node in cluster.nodes:
        n = len(node.devices)
        ranks = str(first_rank) if n == 1 else f"{first_rank}-{first_rank + n - 1}"
        first_rank += n
        table.add_row(
            node.name,
            ranks,
            _devices(node),
            _distinct(f"{d.memory_gib:g}" for d in node.devices),
            _distinct(_speed(d) for d in node.devices),
            _link(node.nic),
            _link(node.intra) if node.intra is not None else "-",
        )
    return table


def _devices(node: Node) -> str:
    groups: list[list[Any]] = []
    for device in node.devices:
        if groups and groups[-1][0] == device.name:
            groups[-1][1] += 1
        else:
            groups.append([device.name, 1])
    return ", ".join(f"{count} x {name}" for name, count in groups)


def _speed(device: Device) -> str:
    text = f"{device.speed:g}"
    if device.model_speed:
        text += " (" + ", ".join(f"{m} {s:g}" for m, s in sorted(device.model_speed.items())) + ")"
    return text


def _distinct(texts: Iterable[str]) -> str:
    return ", ".join(dict.fromkeys(texts))


def _link(link: Link) -> str:
    text = f"{link.bandwidth_gbps:g} Gb/s {link.latency_us:g}"
    if link.per_message_overhead_us:
        text += f"+{link.per_message_overhead_us:g}"
    text += " us"
    if link.loss_rate:
        text += f", loss {link.loss_rate:g}"
    return text
