"""``commsched knobs [POLICY]``: every policy's knobs, their types, ranges and defaults;
``commsched knobs --packet``: every packet-network setting ``--packet KEY=VALUE`` takes."""

from __future__ import annotations

import typing
from dataclasses import fields

import click
from rich.console import Console
from rich.table import Table

from commsched.schedule import POLICIES, knob_class
from commsched.sim.packet.options import options


@click.command(name="knobs", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("policy", required=False, type=click.Choice(sorted(POLICIES)))
@click.option(
    "--packet",
    "packet",
    is_flag=True,
    help="List the packet-network settings (`--sim network=packet --packet KEY=VALUE`) instead.",
)
def command(policy: str | None, packet: bool) -> None:
    """List the knobs of POLICY (default: every policy), as `--knob POLICY.KNOB=VALUE` and
    `parallelize(..., KNOB=VALUE)` take them; with --packet, the packet-network settings."""
    if packet:
        if policy:
            raise click.UsageError("give a POLICY or --packet, not both")
        Console().print(packet_table())
        return
    table = Table(title="policy knobs")
    table.add_column("knob", no_wrap=True)
    for column in ("type", "default", "accepted", "meaning"):
        table.add_column(column)
    for name in [policy] if policy else sorted(POLICIES):
        cls = knob_class(name)
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            accepted = ", ".join(
                f"{op} {f.metadata[key]:g}"
                for key, op in (("gt", ">"), ("ge", ">="))
                if f.metadata.get(key) is not None
            )
            kind = str(hints[f.name]).replace("<class '", "").replace("'>", "")
            table.add_row(f"{name}.{f.name}", kind, str(f.default), accepted or "-", f.metadata.get("doc", ""))
        if not fields(cls):
            table.add_row(f"{name}", "-", "-", "-", "no knobs")
    Console().print(table)


def packet_table() -> Table:
    """Every ``--packet`` key: type, default, unit, accepted values, meaning (from ``PacketConfig``'s fields)."""
    table = Table(title="packet-network settings: --sim network=packet --packet KEY=VALUE")
    table.add_column("key", no_wrap=True)
    for column in ("type", "default", "unit", "accepted", "meaning"):
        table.add_column(column)
    for o in options():
        table.add_row(o.key, o.kind, o.default, o.unit or "-", o.accepts, o.doc)
    return table
