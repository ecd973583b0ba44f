from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched import _compiled


def test_compiled_modules_out_of_date_with_their_source_are_reported_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "_compiled.json"
    monkeypatch.setattr(_compiled, "RECORD", record)
    monkeypatch.setattr(_compiled, "extensions", lambda name: [Path(f"{name}.so")])
    assert _compiled.stale() == list(_compiled.MODULES)  # no record: nothing is known to match
    digests = {name: _compiled.digest(name) for name in _compiled.MODULES}
    record.write_text(json.dumps(digests))
    assert _compiled.stale() == []
    record.write_text(json.dumps({**digests, "commsched.transport.dlcp.rate": "0" * 64}))
    assert _compiled.stale() == ["commsched.transport.dlcp.rate"]


def test_a_group_compiled_only_in_part_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "_compiled.json"
    monkeypatch.setattr(_compiled, "RECORD", record)
    record.write_text(json.dumps({name: _compiled.digest(name) for name in _compiled.MODULES}))
    packet_only = {name for name in _compiled.MODULES if name.startswith("commsched.sim.")}
    monkeypatch.setattr(_compiled, "extensions", lambda name: [Path("x.so")] if name in packet_only else [])
    assert _compiled.stale() == [name for name in _compiled.MODULES if name not in packet_only]


def test_nothing_is_stale_when_nothing_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compiled, "extensions", lambda name: [])
    assert _compiled.stale() == []


def test_a_stale_group_is_found_as_its_sources() -> None:
    finder = _compiled.SourceFinder()
    for name in _compiled.MODULES:
        spec = finder.find_spec(name, None)
        assert spec is not None and spec.origin == str(_compiled.source(name)) and spec.origin.endswith(".py")
    assert finder.find_spec("commsched.sim.packet.model", None) is None
