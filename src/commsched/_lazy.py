"""PEP 562 module attributes imported on first use, for packages whose members need heavy imports."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.homes[name]`` when ``name`` is first used."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    return __getattr__
