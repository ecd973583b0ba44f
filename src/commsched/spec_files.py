"""Reading specification files (workloads, clusters, plans): one way to fail, naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from commsched.errors import SpecError


def read_text(path: str | Path) -> str:
    """The file's text; SpecError naming the file when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SpecError(str(path), [f"<file>: cannot read ({exc.strerror or exc})"]) from None


def parse_json(text: str, source: str) -> Any:
    """JSON text as data; SpecError naming ``source`` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(source, [f"<root>: not valid JSON ({exc})"]) from None
