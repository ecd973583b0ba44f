"""Leftover detection and removal, with the system calls replaced (no root needed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from commsched.testbed import cleanup, loopback, netns

LISTING = "csb-111-0-w0 (id: 1)\ncsb-111-0-br (id: 0)\ncsb-222-0-w0\nunrelated (id: 7)\ncsb-333-0-w0\n"
LINKS = "1: lo: <LOOPBACK,UP>\n9: csb-111-0-x@if3: <BROADCAST>\n10: csb-222-0-y: <BROADCAST>\n"


@pytest.fixture
def fake_system(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """pid 111 is dead, pid 222 is alive and older than its namespace, pid 333 was reused after creation."""
    calls: list[list[str]] = []

    def run_command(argv: list[str], *, check: bool = True, timeout_s: float = 30.0) -> str:
        calls.append(argv)
        if argv == ["ip", "netns", "list"]:
            return LISTING
        if argv == ["ip", "-o", "link", "show"]:
            return LINKS
        return ""

    for name in ("csb-111-0-w0", "csb-111-0-br", "csb-222-0-w0", "csb-333-0-w0"):
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (1000.0, 1000.0))
    starts = {111: None, 222: 900.0, 333: 5000.0}
    monkeypatch.setattr(cleanup, "run_command", run_command)
    monkeypatch.setattr(cleanup, "NETNS_DIR", tmp_path)
    monkeypatch.setattr(cleanup, "_process_start_s", lambda pid: starts.get(pid))
    return calls


def test_leftovers_are_objects_whose_owner_is_dead_or_reused(fake_system: list[list[str]]) -> None:
    found = {(item.kind, item.name) for item in cleanup.find_leftovers()}
    assert found == {
        ("netns", "csb-111-0-w0"),
        ("netns", "csb-111-0-br"),
        ("netns", "csb-333-0-w0"),
        ("link", "csb-111-0-x"),
    }


def test_remove_leftovers_kills_inside_deletes_and_says_so(fake_system: list[list[str]]) -> None:
    messages: list[str] = []
    removed = cleanup.remove_leftovers(messages.append)
    assert len(removed) == 4
    assert ["ip", "netns", "pids", "csb-111-0-w0"] in fake_system  # processes inside are killed first
    assert ["ip", "netns", "del", "csb-111-0-w0"] in fake_system
    assert ["ip", "netns", "del", "csb-333-0-w0"] in fake_system
    assert ["ip", "link", "del", "csb-111-0-x"] in fake_system
    assert not any(c[-1].startswith("csb-222") for c in fake_system if "del" in c)  # a live run is left alone
    assert len(messages) == 1 and "111" in messages[0] and "csb-333-0-w0" in messages[0]


def test_nothing_to_remove_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cleanup, "run_command", lambda argv, **kw: "")
    messages: list[str] = []
    assert cleanup.remove_leftovers(messages.append) == []
    assert messages == []


def test_process_start_time_of_this_process_and_of_a_dead_pid() -> None:
    started = cleanup._process_start_s(os.getpid())
    assert started is not None
    import time

    assert time.time() - 86400 * 365 < started <= time.time() + 1
    assert cleanup._process_start_s(2**22 + 12345) is None  # above any pid_max


def test_without_root_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = netns.netns_unavailable_reason()
    assert reason is not None and "root" in reason


def test_missing_tools_name_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    reason = netns.netns_unavailable_reason()
    assert reason is not None and "ip and tc not found" in reason and "iproute2" in reason


def test_auto_falls_back_to_loopback_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopback, "netns_unavailable_reason", lambda: "network namespaces need root")
    messages: list[str] = []
    with loopback.open_testbed(2, log=messages.append) as bed:
        assert isinstance(bed, loopback.LoopbackTestbed)
        env = bed.env(1, 1, 2, 0, 12345)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
        with pytest.raises(netns.TestbedError, match="cannot shape"):
            bed.set_shape(netns.LinkShape(rate_bps=10**9))
    assert "need root" in messages[0] and "NOT shaped" in messages[0]
