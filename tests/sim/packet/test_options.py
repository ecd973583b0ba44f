"""``KEY=VALUE`` text to a PacketConfig (``--packet``): every key, types, ranges, order."""

from __future__ import annotations

import dataclasses

import pytest

from commsched.errors import ScheduleError
from commsched.sim.packet import PacketConfig, RedParams, TcpParams
from commsched.sim.packet.options import GROUPS, changed_settings, options, packet_config, parse_assignment


def test_every_key_reads_back_its_own_default() -> None:
    for option in options():
        key, value = parse_assignment(f"{option.key}={option.default}")
        group, dot, name = key.partition(".")
        expected = getattr(GROUPS[group](), name) if dot else getattr(PacketConfig(), key)
        assert value == expected, option


def test_assignments_apply_in_order_and_a_red_key_turns_red_on() -> None:
    config = packet_config(["transport=dctcp", "red.max_bytes=120000", "red.min_bytes=60000", "transport=tcp"])
    assert config.transport == "tcp"
    assert config.red == RedParams(min_bytes=60_000, max_bytes=120_000)
    assert packet_config(["red.min_bytes=60000", "red=none"]).red is None
    assert packet_config(["red=true"]).red == RedParams()
    assert packet_config(["red=none", "red.max_p=0.5"]).red == RedParams(max_p=0.5)
    assert changed_settings(packet_config(["tcp.min_rto_s=2e-4", "seed=3"])) == {"seed": 3, "tcp.min_rto_s": 2e-4}


def test_whole_numbers_may_be_written_in_scientific_notation_but_fractions_are_refused() -> None:
    assert parse_assignment("buffer_bytes=1e6") == ("buffer_bytes", 1_000_000)
    assert parse_assignment("tcp.min_rto_s=1") == ("tcp.min_rto_s", 1.0)
    with pytest.raises(ScheduleError, match=r"'buffer_bytes' must be a whole number >= 1, got '1.5'"):
        parse_assignment("buffer_bytes=1.5")


def test_configs_built_in_code_name_the_field_and_the_value_they_refuse() -> None:
    with pytest.raises(ScheduleError, match=r"tcp.min_rto_s must be a finite number > 0, got 0"):
        TcpParams(min_rto_s=0)
    with pytest.raises(ScheduleError, match=r"red.max_p must be a finite number > 0 and <= 1, got 1.5"):
        RedParams(max_p=1.5)
    with pytest.raises(ScheduleError, match=r"topology must be single_switch or leaf_spine, got 'ring'"):
        PacketConfig(topology="ring")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match=r"spines must be a whole number >= 1, got True"):
        PacketConfig(spines=True)
    assert dataclasses.replace(PacketConfig(), fabric_gbps=25).fabric_gbps == 25
