"""``KEY=VALUE`` text to a :class:`PacketConfig`, and the list of every key with its default and unit.

A key is a field of :class:`PacketConfig` or, with a dot, of one of its
groups: ``transport=dctcp``, ``red.min_bytes=60000``,
``tcp.min_rto_s=0.0002`` (:func:`keys` lists them all). A value is read as
its field's type: ``true``/``false`` (also ``yes``/``no``, ``1``/``0``) for a
flag, a whole number (``1e6`` is accepted when it is one) or a finite number
in the field's range, one of the names a choice accepts. ``red`` takes
``none``/``false`` (RED off) or ``true`` (on, with the ``red.*`` defaults);
setting any ``red.*`` key turns RED on.

Guarantees: :func:`parse_assignment` checks one assignment on its own (the
key exists, the value has the field's type and range) and raises
:class:`~commsched.errors.ScheduleError` naming the key and the value, and
listing the known keys for an unknown key; :func:`packet_config` applies
assignments in order (a later one wins) and also raises ScheduleError for
checks that span fields (``red.min_bytes <= red.max_bytes``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from dataclasses import asdict, fields, replace
from typing import Any, Literal, NamedTuple

from commsched.errors import ScheduleError
from commsched.sim.packet.config import DlcpParams, PacketConfig, RedParams, TcpParams, accepted, problem
from commsched.sim.packet.registry import TRANSPORTS

#: The groups of dotted keys: the PacketConfig field (and key prefix) -> its class.
GROUPS: dict[str, type[Any]] = {"red": RedParams, "tcp": TcpParams, "dlcp": DlcpParams}

#: Unit of a field, from the suffix of its name.
UNITS = {"_bytes": "bytes", "_s": "s", "_us": "µs", "_gbps": "Gbit/s", "_segments": "segments"}


class PacketOption(NamedTuple):
    """One settable key: its dotted name, type in words, default, unit, accepted values and meaning."""

    key: str
    kind: str
    default: str
    unit: str
    accepts: str
    doc: str


def _unit(name: str) -> str:
    return next((unit for suffix, unit in UNITS.items() if name.endswith(suffix)), "")


def _shown(default: Any) -> str:
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    return f"{default:g}" if isinstance(default, float) else str(default)


def _kind_words(kind: Any) -> str:
    if typing.get_origin(kind) is Literal:
        return " | ".join(typing.get_args(kind))
    if kind == RedParams | None:
        return "none | true"
    return getattr(kind, "__name__", str(kind))


def _field(cls: type[Any], name: str) -> tuple[dataclasses.Field[Any], Any]:
    f = next(f for f in fields(cls) if f.name == name)
    return f, typing.get_type_hints(cls)[name]


def options() -> list[PacketOption]:
    """Every settable key in order: PacketConfig's fields, then the fields of each group (red.*, tcp.*)."""
    out = []
    for cls, prefix in [(PacketConfig, ""), *((cls, f"{name}.") for name, cls in GROUPS.items())]:
        for f in fields(cls):
            if prefix == "" and f.name in ("tcp", "dlcp"):
                continue  # a group, not a value: set its fields (tcp.*)
            kind = typing.get_type_hints(cls)[f.name]
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.name == "transport":
                accepts = " | ".join(TRANSPORTS)
            elif kind in (int, float):
                accepts = accepted(f) or "any"
            else:
                accepts = _kind_words(kind) if kind is not bool else "true | false"
            shown = _shown(default)
            doc = str(f.metadata.get("doc", ""))
            out.append(PacketOption(prefix + f.name, _kind_words(kind), shown, _unit(f.name), accepts, doc))
    return out


def keys() -> list[str]:
    """Every settable key (``red``, ``red.min_bytes``, ``tcp.min_rto_s``, ...)."""
    return [o.key for o in options()]


def _unknown(key: str) -> ScheduleError:
    hint = " (a group: set its fields, e.g. tcp.min_rto_s=0.0002)" if key in ("tcp", "dlcp") else ""
    return ScheduleError(f"packet option {key!r}: unknown key{hint}; known: {', '.join(keys())}")


def _convert(key: str, f: dataclasses.Field[Any], kind: Any, text: str) -> Any:
    lowered = text.strip().lower()
    if kind == RedParams | None:
        if lowered in ("none", "null", "false", "no", "off", "0"):
            return None
        if lowered in ("true", "yes", "on", "1"):
            return RedParams()
        raise ScheduleError(f"packet option {key!r} must be none or true, got {text!r}")
    if kind is bool:
        if lowered in ("true", "yes", "1", "false", "no", "0"):
            return lowered in ("true", "yes", "1")
        raise ScheduleError(f"packet option {key!r} must be true or false, got {text!r}")
    if kind in (int, float):
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if kind is int and math.isfinite(number) and number.is_integer():
            return int(number)
        if kind is float and math.isfinite(number):
            return number
        value: Any = text
    else:
        value = text.strip()
    if f.name == "transport" and value not in TRANSPORTS:
        raise ScheduleError(f"packet option {key!r} must be one of {', '.join(TRANSPORTS)}, got {text!r}")
    return value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"red.min_bytes=60000"`` -> ``("red.min_bytes", 60000)``, the key and the value checked (module doc)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScheduleError(f"packet option {text!r}: expected KEY=VALUE, e.g. transport=dctcp")
    if key not in keys():
        raise _unknown(key)
    group, dot, name = key.partition(".")
    f, kind = _field(GROUPS[group], name) if dot else _field(PacketConfig, key)
    value = _convert(key, f, kind, raw)
    what = problem(f, kind, value)
    if what is not None:
        raise ScheduleError(f"packet option {key!r} must be {what}, got {raw!r}")
    return key, value


def packet_config(assignments: Iterable[tuple[str, Any] | str], base: PacketConfig | None = None) -> PacketConfig:
    """``base`` (default ``PacketConfig()``) with ``assignments`` (parsed pairs or ``KEY=VALUE`` text) applied."""
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for item in assignments:
        key, value = parse_assignment(item) if isinstance(item, str) else item
        group, dot, name = key.partition(".")
        if dot:
            groups[group][name] = value
        else:
            top[key] = value
            if key == "red":
                groups["red"].clear()  # red=none/true resets what came before it
    config = base or PacketConfig()
    for name, values in groups.items():
        if values:
            current = top.get(name, getattr(config, name)) or GROUPS[name]()
            top[name] = replace(current, **values)
    return replace(config, **top) if top else config


def changed_settings(config: PacketConfig) -> dict[str, Any]:
    """``{dotted key: value}`` for every setting of ``config`` that differs from ``PacketConfig()``."""
    default = asdict(PacketConfig())
    out: dict[str, Any] = {}
    for key, value in asdict(config).items():
        if isinstance(value, dict):
            base = default[key] or {}
            out.update({f"{key}.{k}": v for k, v in value.items() if base.get(k, None) != v or not base})
        elif value != default[key]:
            out[key] = value
    return out
