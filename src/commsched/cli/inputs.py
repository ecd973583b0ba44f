"""Resolving what a user typed: a model name or file, option strings, knob values, files to write."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from commsched.errors import CommschedError, ScheduleError, SpecError
from commsched.schedule import knobs as policy_knobs
from commsched.schedule import make_knobs
from commsched.sim.simulator import SimOptions
from commsched.workload import Workload


def load_workload(spec: str | Path) -> Workload:
    """A Workload JSON file by path, else a model of the built-in zoo by name."""
    path = Path(spec)
    if path.is_file():
        return Workload.load(path)
    if path.suffix == ".json" or "/" in str(spec):
        raise SpecError(str(spec), ["<file>: no such file"])
    try:
        zoo: Any = importlib.import_module("commsched.zoo")
    except ImportError:
        raise SpecError("model", [f"{str(spec)!r} is not a file, and the model zoo is not available"]) from None
    try:
        workload: Workload = zoo.load(str(spec))
    except CommschedError:
        raise
    except (KeyError, ValueError, OSError) as exc:
        raise SpecError("model", [f"{str(spec)!r} is neither a Workload JSON file nor a zoo model ({exc})"]) from None
    return workload


def parse_value(text: str) -> Any:
    """``"none"`` -> None, ``"true"``/``"false"`` -> bool, numbers -> int/float, else the string."""
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_pairs(pairs: Iterable[str]) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``; a malformed pair raises ScheduleError."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ScheduleError(f"option {pair!r}: expected key=value")
        out[key.strip()] = parse_value(value)
    return out


def split_options(policy: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``key=value`` options into (policy knobs, simulator options), checking names and types."""
    known = policy_knobs(policy)
    sim_names = SimOptions.names()
    knob_values: dict[str, Any] = {}
    sim_values: dict[str, Any] = {}
    for key, value in options.items():
        if key in sim_names:
            sim_values[key] = value
        elif key in known:
            knob_values[key] = value
        else:
            names = ", ".join([*known, *sim_names])
            raise ScheduleError(f"{policy}: unknown option {key!r}; known: {names}")
    make_knobs(policy, knob_values)  # names, types and ranges, before anything runs
    if "max_concurrent" in sim_values and not isinstance(sim_values["max_concurrent"], int):
        raise ScheduleError(f"sim: max_concurrent must be an integer >= 1, got {sim_values['max_concurrent']!r}")
    if "update_ms" in sim_values:
        value = sim_values["update_ms"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScheduleError(f"sim: update_ms must be a number, got {value!r}")
    return knob_values, sim_values


class OutputFile(click.Path):
    """A file a command writes (``--trace``, ``--plot``, ``--out``): its folder is created if missing.

    The folder (with its parents) is made when the option is parsed, so a path
    such as ``runs/today/t.json`` works on the first run; a folder that cannot
    be made is a usage error naming it.
    """

    def __init__(self) -> None:
        super().__init__(dir_okay=False, writable=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        folder = Path(value).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.fail(f"cannot create the folder {str(folder)!r} ({exc.strerror})", param, ctx)
        return super().convert(value, param, ctx)
