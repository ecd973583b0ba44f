"""Typed knobs: each policy's tunable settings as a frozen dataclass, checked where it is made.

A policy declares its knobs once::

    @dataclass(frozen=True)
    class DeARKnobs(Knobs):
        policy: ClassVar[str] = "dear"
        threshold_mb: float = knob(25.0, gt=0, doc="fusion threshold, MiB")
        lookahead: int = knob(1, ge=1, doc="all-gathers in flight ahead of the forward")

and everything else is derived from that declaration: the names and defaults
(:meth:`Knobs.defaults`), the checks (types from the annotations, ranges from
:func:`knob`) and the parsing of command-line text (:meth:`Knobs.parse_text`). Errors raise
:class:`~commsched.errors.ScheduleError` naming the policy, the knob, the value
and what is accepted, at construction: ``parallelize()``, a CLI's argument
parsing and a plan file's loading all build knobs before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from commsched.errors import ScheduleError


def knob(
    default: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] = (),
    doc: str = "",
    before: Any = None,
) -> Any:
    """A knob field: its default, its range (``gt``/``ge``/``lt``/``le``) or, for text, its ``choices``,
    and a one-line doc. ``before``: for a knob added after runs were recorded, the value that does what the
    policy did before it existed, where that is not its default (:meth:`Knobs.as_recorded`)."""
    metadata = {"gt": gt, "ge": ge, "lt": lt, "le": le, "choices": choices, "doc": doc, "before": before}
    return field(default=default, metadata=metadata)


def _kind(annotation: Any) -> tuple[type, bool]:
    """``(base type, accepts None)`` of a knob's annotation (``float``, ``int``, ``bool``, ``float | None``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


@dataclass(frozen=True)
class Knobs:
    """Base of every policy's knobs. Subclasses set ``policy`` and declare fields with :func:`knob`."""

    policy: ClassVar[str] = "?"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = self._checked(f, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)

    # ---- checking ----

    def _checked(self, f: dataclasses.Field[Any], annotation: Any, value: Any) -> Any:
        base, optional = _kind(annotation)
        name = f"{self.policy}: knob {f.name!r}"
        if value is None:
            if optional:
                return None
            raise ScheduleError(f"{name} must be {_describe(base, f)}, got none")
        if base is bool:
            if not isinstance(value, bool):
                raise ScheduleError(f"{name} must be true or false, got {value!r}")
            return value
        if base is str:
            if not isinstance(value, str) or value not in f.metadata.get("choices", ()):
                raise ScheduleError(f"{name} must be {_describe(base, f)}, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScheduleError(f"{name} must be {_describe(base, f)}, got {value!r}")
        if base is int:
            if not float(value).is_integer():
                raise ScheduleError(f"{name} must be {_describe(base, f)}, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        m = f.metadata
        if (
            (m.get("gt") is not None and not value > m["gt"])
            or (m.get("ge") is not None and not value >= m["ge"])
            or (m.get("lt") is not None and not value < m["lt"])
            or (m.get("le") is not None and not value <= m["le"])
        ):
            raise ScheduleError(f"{name} must be {_describe(base, f)}, got {value!r}")
        return value

    # ---- construction ----

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None = None) -> Self:
        """Knobs from a mapping of names to values; unknown names raise, naming the known ones."""
        values = dict(values or {})
        known = cls.names()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ScheduleError(
                f"{cls.policy}: unknown knob(s) {', '.join(map(repr, unknown))}; known: {', '.join(known) or 'none'}"
            )
        return cls(**values)

    @classmethod
    def parse_text(cls, name: str, text: str) -> Any:
        """The value of knob ``name`` from command-line text (``"8"``, ``"true"``, ``"none"``), checked."""
        if name not in cls.names():
            raise ScheduleError(f"{cls.policy}: unknown knob {name!r}; known: {', '.join(cls.names()) or 'none'}")
        hints = typing.get_type_hints(cls)
        base, optional = _kind(hints[name])
        f = next(f for f in fields(cls) if f.name == name)
        lowered = text.strip().lower()
        if lowered in ("none", "null") and optional:
            return None
        if base is bool and lowered in ("true", "false", "1", "0", "yes", "no"):
            return lowered in ("true", "1", "yes")
        if base is str:
            return getattr(cls(**{name: text.strip()}), name)
        if base in (int, float):
            try:
                number = float(text)
            except ValueError:
                raise ScheduleError(f"{cls.policy}: knob {name!r} must be {_describe(base, f)}, got {text!r}") from None
            return getattr(cls(**{name: number}), name)
        raise ScheduleError(f"{cls.policy}: knob {name!r} must be {_describe(base, f)}, got {text!r}")

    # ---- reading ----

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in fields(cls)}

    @classmethod
    def as_recorded(cls, recorded: Mapping[str, Any] | None) -> dict[str, Any]:
        """The knobs a recorded run used: ``recorded`` (a plan's knobs, None where the run recorded none), with
        every knob it lacks that has a ``before`` value set to that value (the run's code had no such knob)."""
        given = dict(recorded or {})
        return {
            **{f.name: f.metadata["before"] for f in dataclasses.fields(cls) if f.metadata.get("before") is not None},
            **given,
        }

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _describe(base: type, f: dataclasses.Field[Any]) -> str:
    """What a knob accepts, in words: ``a number > 0``, ``a whole number >= 1``, ``true or false``."""
    if base is bool:
        return "true or false"
    if base is str:
        return "one of " + ", ".join(f.metadata.get("choices", ()))
    what = "a whole number" if base is int else "a number"
    ops = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
    bounds = [f"{op} {f.metadata[key]:g}" for key, op in ops if f.metadata.get(key) is not None]
    return f"{what} {' and '.join(bounds)}" if bounds else what


@dataclass(frozen=True)
class NoKnobs(Knobs):
    """No knobs: for schedulers made outside the registry (tests, experiments)."""

    policy: ClassVar[str] = "scheduler"
