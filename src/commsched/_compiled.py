"""Which modules run compiled by mypyc, and whether they still match their sources.

Two packages hold them: the packet-level network's core
(:mod:`commsched.sim.packet`: ``pfabric`` (its switch queue), ``port``, ``fabric``, ``transport``, ``newreno``,
``variants``, ``registry``, ``connection`` and ``dlcp``, the driver of DLCP's
state machines) and DLCP's clock-free state machines themselves
(:mod:`commsched.transport.dlcp`: ``protocol``, ``sender``, ``rate_params`` and ``rate``), which the UDP
link and the simulator share, with the link's per-datagram path (``wire``, ``udp``, ``slots``,
``control``, ``inbound``, ``outbound`` and ``engine``, the I/O thread). They are compiled
together, as one mypyc group (calls between them are native), by
``python -m commsched.sim.packet.compile``; the extension modules sit next to
their sources and take precedence on import, for the link as for the
simulator. There is no second implementation: the sources stay the only code.

The hashes of the compiled sources are written to ``_compiled.json``. If any
compiled module is out of date with its source, or only some are compiled,
every one of them runs from source (a group's compiled modules expect each
other's native classes): :func:`use_sources_if_stale`, which both packages
call before importing any of their modules, then puts a finder first on
``sys.meta_path`` that loads the ``.py`` files, and warns once.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: The compiled modules, in import order.
MODULES = (
    "commsched.transport.dlcp.protocol",
    "commsched.transport.dlcp.sender",
    "commsched.transport.dlcp.rate_params",
    "commsched.transport.dlcp.rate",
    "commsched.transport.dlcp.wire",
    "commsched.transport.dlcp.udp",
    "commsched.transport.dlcp.slots",
    "commsched.transport.dlcp.control",
    "commsched.transport.dlcp.inbound",
    "commsched.transport.dlcp.outbound",
    "commsched.transport.dlcp.engine",
    "commsched.sim.packet.pfabric",
    "commsched.sim.packet.port",
    "commsched.sim.packet.fabric",
    "commsched.sim.packet.transport",
    "commsched.sim.packet.newreno",
    "commsched.sim.packet.variants",
    "commsched.sim.packet.registry",
    "commsched.sim.packet.connection",
    "commsched.sim.packet.dlcp",
)
SRC = Path(__file__).resolve().parent.parent  # the directory holding the ``commsched`` package
RECORD = SRC / "commsched" / "_compiled.json"


def source(name: str) -> Path:
    """The ``.py`` file of module ``name``."""
    return SRC.joinpath(*name.split(".")).with_suffix(".py")


def extensions(name: str) -> list[Path]:
    """The extension modules built from ``name`` (none when it is not compiled)."""
    path = source(name)
    return [*path.parent.glob(f"{path.stem}.*.so"), *path.parent.glob(f"{path.stem}.*.pyd")]


def digest(name: str) -> str:
    return hashlib.sha256(source(name).read_bytes()).hexdigest()


def compiled() -> bool:
    """Whether an extension module exists for every module of the group."""
    return all(extensions(name) for name in MODULES)


def stale() -> list[str]:
    """Modules that would run compiled code older than their source, or without the rest of their group.

    [] when nothing is compiled, or everything is and matches its recorded source.
    """
    if not any(extensions(name) for name in MODULES):
        return []
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return list(MODULES)
    return [name for name in MODULES if not extensions(name) or record.get(name) != digest(name)]


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of the group as their ``.py`` sources, never as extension modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


_stale: list[str] | None = None


def use_sources_if_stale() -> list[str]:
    """Decide once per process: if :func:`stale` names modules, run the whole group from source. Returns them."""
    global _stale
    if _stale is None:
        _stale = stale()
        if _stale:
            warnings.warn(
                f"commsched: compiled {', '.join(_stale)} out of date with the source or without the rest of "
                "their group; running pure Python (recompile: python -m commsched.sim.packet.compile)",
                stacklevel=3,
            )
            sys.meta_path.insert(0, SourceFinder())
    return _stale
