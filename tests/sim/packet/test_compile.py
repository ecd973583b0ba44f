from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched.sim.packet import _core as packet_compile


def test_compiled_modules_out_of_date_with_their_source_are_reported_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "_compiled.json"
    monkeypatch.setattr(packet_compile, "RECORD", record)
    monkeypatch.setattr(packet_compile, "compiled", lambda: True)
    assert packet_compile.stale() == list(packet_compile.MODULES)  # no record: nothing is known to match
    digests = {name: packet_compile.digest(name) for name in packet_compile.MODULES}
    record.write_text(json.dumps(digests))
    assert packet_compile.stale() == []
    record.write_text(json.dumps({**digests, "transport": "0" * 64}))
    assert packet_compile.stale() == ["transport"]


def test_nothing_is_stale_when_nothing_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packet_compile, "compiled", lambda: False)
    assert packet_compile.stale() == []
