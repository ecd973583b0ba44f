"""``python -m commsched ...``: the ``commsched`` command, for environments where its script is not on PATH."""

from commsched.cli import cli

cli(prog_name="commsched")
