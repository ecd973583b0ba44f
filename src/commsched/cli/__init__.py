"""The ``commsched`` command line. Thin: every command calls library functions."""

from __future__ import annotations

import importlib
from typing import Any

import click

from commsched.errors import CommschedError

# Subcommand modules, each exporting a click command or group named ``command``.
_SUBCOMMANDS = ("zoo", "cluster", "knobs", "simulate", "compare", "advise", "plan", "bench", "profile")


class _Group(click.Group):
    """Turns commsched's own errors into one clear message (exit status 1), no traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CommschedError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="commsched")
def cli() -> None:
    """Schedule gradient communication for data-parallel training, simulate it, measure it."""


for _name in _SUBCOMMANDS:
    cli.add_command(importlib.import_module(f"commsched.cli.{_name}").command)
cli.add_command(importlib.import_module("commsched.cli.compare_trace").compare_trace_command, name="compare-trace")


def main() -> None:
    cli()
