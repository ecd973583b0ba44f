"""Which packet-core modules are compiled, and whether they match their sources (see :mod:`.compile`).

Kept apart from :mod:`.compile` so that importing the package does not import
the command-line module.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2]  # the directory holding the ``commsched`` package
#: The modules that are compiled, in import order.
MODULES = ("fabric", "transport", "connection")
RECORD = HERE / "_compiled.json"


def digest(name: str) -> str:
    return hashlib.sha256((HERE / f"{name}.py").read_bytes()).hexdigest()


def compiled() -> bool:
    """Whether an extension module exists for every compiled module."""
    return all(any(HERE.glob(f"{name}.*.so")) or any(HERE.glob(f"{name}.*.pyd")) for name in MODULES)


def stale() -> list[str]:
    """Modules whose source changed since they were compiled ([] when not compiled or up to date)."""
    if not compiled():
        return []
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return list(MODULES)
    return [name for name in MODULES if record.get(name) != digest(name)]
