"""Knob kinds beyond numbers with lower bounds: upper bounds and text with choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from commsched.errors import ScheduleError
from commsched.schedule.knobs import Knobs, knob


@dataclass(frozen=True)
class _Example(Knobs):
    policy: ClassVar[str] = "example"
    fraction: float = knob(0.01, ge=0, lt=1, doc="a fraction")
    mode: str = knob("ps", choices=("ps", "collective"), doc="where sums are made")


def test_defaults_and_good_values_pass() -> None:
    assert _Example().to_dict() == {"fraction": 0.01, "mode": "ps"}
    assert _Example(fraction=0.0, mode="collective").mode == "collective"


@pytest.mark.parametrize("value", [1.0, 1.5, -0.1])
def test_a_number_outside_both_bounds_is_refused_naming_them(value: float) -> None:
    with pytest.raises(ScheduleError, match=r"'fraction' must be a number >= 0 and < 1, got"):
        _Example(fraction=value)


@pytest.mark.parametrize("value", ["tree", 3, None, ""])
def test_text_outside_its_choices_is_refused_listing_them(value: object) -> None:
    with pytest.raises(ScheduleError, match=r"'mode' must be one of ps, collective, got"):
        _Example(mode=value)  # type: ignore[arg-type]


def test_command_line_text_parses_to_each_kind() -> None:
    assert _Example.parse_text("mode", " collective ") == "collective"
    assert _Example.parse_text("fraction", "0.05") == 0.05
    with pytest.raises(ScheduleError, match="one of ps, collective"):
        _Example.parse_text("mode", "ring")
