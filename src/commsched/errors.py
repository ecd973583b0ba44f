"""Typed errors. Each says what was expected, what was found, and where."""

from __future__ import annotations

from typing import Any


class CommschedError(Exception):
    """Base class of every error commsched raises on purpose."""


class SpecError(CommschedError, ValueError):
    """A workload, cluster or plan specification is invalid.

    ``problems`` holds one ``"path: message, got value"`` line per problem, e.g.
    ``layers[3].tensors[0].numel: must be > 0, got -5``.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"invalid {source}:\n{lines}")


class ScheduleError(CommschedError):
    """A scheduler was driven in a way its contract forbids."""


class RuntimeCommError(CommschedError, RuntimeError):
    """Distributed training failed: a peer crashed or hung, or ranks disagree."""


class UnsupportedError(CommschedError, TypeError):
    """A feature (optimizer, dtype, backend) that a policy cannot support."""


def format_path(loc: tuple[Any, ...]) -> str:
    """``('layers', 3, 'tensors', 0, 'numel')`` -> ``layers[3].tensors[0].numel``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


_PHRASES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "missing": "is required",
    "extra_forbidden": "is not a known field",
    "string_too_short": "must not be empty",
    "too_short": "must have at least {min_length} item(s)",
    "literal_error": "must be one of {expected}",
    "finite_number": "must be a finite number",
    # type errors: pydantic's own wording ends in a clause that clashes with the appended ", got ..."
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
}


def _plain_number(value: Any) -> Any:
    """``0.0`` -> ``0`` so a bound on a float field reads like the one on an int field."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def spec_error_from_pydantic(source: str, exc: Any) -> SpecError:
    """Turn a ``pydantic.ValidationError`` into a SpecError with readable lines."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        template = _PHRASES.get(err["type"])
        value = err.get("input")
        if err["type"] == "int_type" and isinstance(value, float) and not value.is_integer():
            template = _PHRASES["int_from_float"]  # strict models refuse 2.5 as they refuse 2.0: say why
        ctx = {key: _plain_number(value) for key, value in (err.get("ctx") or {}).items()}
        if template is not None:
            try:
                message = template.format(**ctx)
            except KeyError:
                message = err["msg"]
        else:
            message = err["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, ") :]
        if err["type"] in ("missing", "value_error", "assertion_error"):
            # our own validators already name the offending value
            problems.append(f"{format_path(loc)}: {message}")
        else:
            problems.append(f"{format_path(loc)}: {message}, got {value!r}")
    return SpecError(source, problems)


class PlanMismatchError(CommschedError, ValueError):
    """A plan does not fit the model or the run it was given to (names, shapes, world size, order)."""


class WireError(CommschedError, ValueError):
    """A datagram or message that does not decode: too short, a bad MAC, a field out of range.

    ``reason`` is one short word (``"mac"``, ``"short"``, ``"range"``, ...) a
    receiver counts rejected datagrams by.
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")
