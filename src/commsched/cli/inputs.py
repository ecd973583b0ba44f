"""Resolving what a user typed: a model name or file, option strings, knob values, files to write."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from commsched.errors import CommschedError, ScheduleError, SpecError
from commsched.schedule import knob_class, make_knobs
from commsched.sim.options import SimOptions
from commsched.sim.packet import PacketConfig
from commsched.sim.packet.options import packet_config, parse_assignment
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


KNOB_HELP = "POLICY.KNOB=VALUE, repeatable (e.g. dear.threshold_mb=8); `commsched knobs` lists every policy's"
SIM_HELP = (
    "KEY=VALUE, repeatable: a simulator option: algorithm=ring|tree|hierarchical|ps, "
    "max_concurrent=N (default 1), update_ms=X (default 0), network=flow|packet (packet level: docs/simulator.md)"
)
PACKET_HELP = (
    "KEY=VALUE, repeatable, with --sim network=packet: a packet-network setting, e.g. transport=dctcp, "
    "topology=leaf_spine, load_balancing=spray, red.min_bytes=60000, tcp.min_rto_s=0.0002, priority_classes=4; "
    "`commsched knobs --packet` lists every key with its default and unit"
)


def parse_knob(text: str) -> tuple[str, str, Any]:
    """``"dear.threshold_mb=8"`` -> ``("dear", "threshold_mb", 8.0)``, checked against the policy's knobs.

    The one knob syntax of every command. Raises ScheduleError naming the
    policy, the knob, the value and what is accepted.
    """
    target, sep, value = text.partition("=")
    policy, dot, name = target.strip().partition(".")
    if not sep or not dot or not policy or not name:
        raise ScheduleError(f"knob {text!r}: expected POLICY.KNOB=VALUE, e.g. dear.threshold_mb=8")
    return policy, name, knob_class(policy).parse_text(name, value)


def knobs_by_policy(assignments: Iterable[tuple[str, str, Any]], policies: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Parsed ``--knob`` values grouped by policy; a knob of a policy that is not run is an error."""
    running = list(policies)
    out: dict[str, dict[str, Any]] = {}
    for policy, name, value in assignments:
        if policy not in running:
            raise ScheduleError(f"knob {policy}.{name}: {policy} is not run here (running: {', '.join(running)})")
        out.setdefault(policy, {})[name] = value
    for policy, values in out.items():
        make_knobs(policy, values)
    return out


class KnobAssignment(click.ParamType):
    """A ``--knob POLICY.KNOB=VALUE`` option, checked when the command line is parsed."""

    name = "POLICY.KNOB=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return parse_knob(str(value))
        except ScheduleError as exc:
            self.fail(str(exc), param, ctx)


def parse_sim_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``--sim KEY=VALUE`` pairs as simulator options, checked (names and values) now."""
    options = parse_pairs(pairs)
    SimOptions.from_mapping(options)
    return options


class PacketAssignment(click.ParamType):
    """A ``--packet KEY=VALUE`` option, its key and value checked when the command line is parsed."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return parse_assignment(str(value))
        except ScheduleError as exc:
            self.fail(str(exc), param, ctx)


def packet_settings(assignments: Iterable[tuple[str, Any]], sim_options: dict[str, Any]) -> PacketConfig | None:
    """The ``PacketConfig`` that ``--packet`` pairs describe (None when none were given), checked as a whole.

    ``--packet`` without ``--sim network=packet`` is a usage error: the
    settings would be silently ignored by the flow-level model.
    """
    given = list(assignments)
    if not given:
        return None
    if sim_options.get("network") != "packet":
        keys = ", ".join(key for key, _ in given)
        raise click.UsageError(f"--packet ({keys}) needs --sim network=packet")
    try:
        return packet_config(given)
    except ScheduleError as exc:
        raise click.BadParameter(str(exc), param_hint="'--packet'") from None


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
