"""``commsched knobs [POLICY]``: every policy's knobs, their types, ranges and defaults;
``commsched knobs --packet``: every packet-network setting ``--packet KEY=VALUE`` takes."""

from __future__ import annotations

import typing
from dataclasses import fields

import click
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

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
        console = Console(width=click.get_current_context().terminal_width)  # None: the terminal's own
        print_packet_options(console)
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


#: The narrowest the wrapping columns of the packet table may get (``accepted``, ``meaning``) before the
#: table gives way to one key per line: below about 20 characters a meaning wraps into a word per line.
_MIN_ACCEPTED, _MIN_MEANING = 14, 24
_FIXED = ("key", "type", "default", "unit")  # never cut, never wrapped


def _rows() -> list[tuple[str, str, str, str, str, str]]:
    return [(o.key, o.kind, o.default, o.unit or "-", o.accepts, o.doc) for o in options()]


def _fixed_widths(rows: list[tuple[str, str, str, str, str, str]]) -> list[int]:
    return [max(len(column), *(len(r[i]) for r in rows)) for i, column in enumerate(_FIXED)]


def packet_table() -> Table:
    """Every ``--packet`` key: type, default, unit, accepted values, meaning (from ``PacketConfig``'s fields).

    Key, type, default and unit are never cut: their columns are as wide as their widest value;
    ``accepted`` folds and ``meaning`` wraps into the rest of the width.
    """
    rows = _rows()
    table = Table(title="packet-network settings: --sim network=packet --packet KEY=VALUE")
    for column, width in zip(_FIXED, _fixed_widths(rows), strict=True):
        table.add_column(column, no_wrap=True, min_width=width)
    table.add_column("accepted", overflow="fold", min_width=_MIN_ACCEPTED)
    table.add_column("meaning", min_width=_MIN_MEANING)
    for row in rows:
        table.add_row(*row)
    return table


def packet_table_width() -> int:
    """The least console width at which :func:`packet_table` cuts no value (the columns' minimums and borders)."""
    columns = [*_fixed_widths(_rows()), _MIN_ACCEPTED, _MIN_MEANING]
    return sum(columns) + 3 * len(columns) + 1  # "│ " before each cell, " " after it, and the last "│"


def print_packet_options(console: Console) -> None:
    """The packet table when the console is wide enough for it, else one key per line, its default whole."""
    if console.width >= packet_table_width():
        console.print(packet_table())
        return
    console.print("packet-network settings: --sim network=packet --packet KEY=VALUE", soft_wrap=True)
    for o in options():
        unit = f" {o.unit}" if o.unit else ""
        kind = o.kind if o.kind == o.accepts else f"{o.kind}; {o.accepts}"
        console.print(f"{o.key}={o.default}{unit}  ({kind})", soft_wrap=True, markup=False, highlight=False)
        console.print(Padding(Text(o.doc), (0, 0, 0, 4), expand=False))
