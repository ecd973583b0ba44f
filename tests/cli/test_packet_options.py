"""``--packet KEY=VALUE`` on ``simulate`` and ``compare``, and ``commsched knobs --packet``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from commsched.cli import cli
from commsched.cli.knobs import packet_table_width
from commsched.sim.packet.options import keys, options


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), terminal_width=200)
    return result.exit_code, result.output


@pytest.fixture
def four_nodes(tmp_path: Path) -> str:
    """4 single-GPU nodes at 10 Gbit/s: small enough for a packet-level run in a second."""
    nic = {"bandwidth_gbps": 10.0, "latency_us": 10.0}
    nodes = [{"name": f"n{i}", "count": 1, "device": {"name": "gpu", "memory_gib": 16}, "nic": nic} for i in range(4)]
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump({"name": "four", "nodes": nodes}))
    return str(path)


def _simulate_json(cluster: str, *extra: str) -> dict[str, Any]:
    args = ["simulate", "-m", "resnet18", "-c", cluster, "-p", "ddp", "-n", "1", "--warmup", "0", "--json", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_packet_settings_reach_the_simulated_network(four_nodes: str) -> None:
    data = _simulate_json(
        four_nodes, "--sim", "network=packet",
        "--packet", "topology=leaf_spine", "--packet", "hosts_per_leaf=2", "--packet", "load_balancing=spray",
        "--packet", "transport=dctcp", "--packet", "red.min_bytes=60000", "--packet", "tcp.min_rto_s=0.0002",
        "--packet", "priority_classes=4",
    )  # fmt: skip
    settings = data["packet"]["settings"]
    assert settings["topology"] == "leaf_spine" and settings["transport"] == "dctcp"
    assert settings["red"]["min_bytes"] == 60000 and settings["red"]["max_bytes"] == 90000
    assert settings["tcp"]["min_rto_s"] == 0.0002 and settings["priority_classes"] == 4
    # the leaf-spine was built: the spine links carried the ring's traffic between the two leaves
    assert data["result"]["link_utilisation"]["leaf0>spine0"] > 0
    assert {row["connection"] for row in data["packet"]["connections"]} >= {"w1->w2/c0"}


def test_the_table_names_the_packet_settings_that_differ_from_the_defaults(four_nodes: str) -> None:
    code, out = _invoke(
        "simulate", "-m", "resnet18", "-c", four_nodes, "-p", "ddp", "-n", "1", "--warmup", "0",
        "--sim", "network=packet", "--packet", "transport=dctcp", "--packet", "buffer_bytes=2e5",
    )  # fmt: skip
    assert code == 0, out
    assert "network=packet" in out and "buffer_bytes=200000" in out and "transport=dctcp" in out


def test_a_trace_with_record_queues_carries_queue_depth_counters(four_nodes: str, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _simulate_json(four_nodes, "--sim", "network=packet", "--packet", "record_queues=true", "--trace", str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e["ph"] == "C" and e["name"].startswith("queue ") for e in events)


def test_compare_runs_every_policy_on_the_given_packet_network(four_nodes: str) -> None:
    args = ["compare", "-m", "resnet18", "-c", four_nodes, "-p", "ddp,dear", "-n", "1", "--warmup", "0", "--json"]
    result = CliRunner().invoke(cli, [*args, "--sim", "network=packet", "--packet", "transport=dctcp"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["packet"] == {"transport": "dctcp"}
    assert set(data["results"]) == {"ddp", "dear"}
    assert all("iteration_ms" in r for r in data["results"].values())


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ("tcp.minrto=1", ["'tcp.minrto'", "unknown key", "known:", "tcp.min_rto_s", "red.max_bytes", "transport"]),
        ("tcp=fast", ["'tcp'", "a group", "known:"]),
        ("spines=0", ["'spines'", "whole number >= 1", "'0'"]),
        ("red.max_p=2", ["'red.max_p'", "> 0 and <= 1", "'2'"]),
        ("tcp.min_rto_s=soon", ["'tcp.min_rto_s'", "a finite number > 0", "'soon'"]),
        ("transport=quic", ["'transport'", "tcp, dctcp, pfabric", "'quic'"]),
        ("topology=ring", ["'topology'", "single_switch or leaf_spine", "'ring'"]),
        ("pfabric=maybe", ["'pfabric'", "true or false", "'maybe'"]),
        ("red.min_bytes=100000", ["red.min_bytes <= red.max_bytes", "100000, 90000"]),
        ("transport", ["expected KEY=VALUE"]),
    ],
)
def test_a_bad_packet_key_or_value_is_refused_before_anything_runs(value: str, needles: list[str]) -> None:
    for command in (["simulate", "-p", "ddp"], ["compare", "-p", "ddp"]):
        args = [*command, "-m", "resnet18", "-c", "no-such-cluster", "--sim", "network=packet", "--packet", value]
        code, out = _invoke(*args)
        assert code == 2, out  # a usage error, raised before the (missing) cluster is even looked up
        assert "Traceback" not in out and "--packet" in out
        for needle in needles:
            assert needle in out, (needle, out)


def test_packet_without_the_packet_network_is_a_usage_error() -> None:
    for command in ("simulate", "compare"):
        args = [command, "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "ddp", "--packet", "transport=dctcp"]
        code, out = _invoke(*args)
        assert code == 2 and "--packet (transport) needs --sim network=packet" in out, out
        code, out = _invoke(*args, "--sim", "network=flow")
        assert code == 2 and "needs --sim network=packet" in out, out


def test_tune_with_packet_settings_is_refused() -> None:
    code, out = _invoke(
        "simulate", "-m", "resnet18", "-c", "8xV100-10GbE", "-p", "dear", "--tune",
        "--sim", "network=packet", "--packet", "transport=dctcp",
    )  # fmt: skip
    assert code == 2 and "--tune" in out and "--packet" in out, out


def test_knobs_packet_lists_every_key_with_its_default_and_unit() -> None:
    code, out = _invoke("knobs", "--packet")
    assert code == 0, out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert set(keys()) <= set(rows), set(keys()) - set(rows)
    assert "0.001" in rows["tcp.min_rto_s"] and "│ s " in rows["tcp.min_rto_s"]
    assert "1000000" in rows["buffer_bytes"] and "bytes" in rows["buffer_bytes"]
    assert "tcp" in rows["transport"] and "dctcp" in out
    code, out = _invoke("knobs", "dear", "--packet")
    assert code == 2 and "not both" in out


@pytest.mark.parametrize("width", [200, 80, 40])
def test_knobs_packet_never_cuts_a_default_at_any_width(width: int) -> None:
    result = CliRunner().invoke(cli, ["knobs", "--packet"], terminal_width=width)
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    if width >= packet_table_width():
        rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in result.output.splitlines()
                if line.startswith("│") and line.split("│")[1].strip()}  # fmt: skip
        assert all(rows[o.key] == o.default for o in options()), rows
    else:  # one key per line: KEY=DEFAULT [unit]
        lines = result.output.splitlines()
        for o in options():
            assert any(line.startswith(f"{o.key}={o.default}") for line in lines), o.key


def test_simulate_and_compare_help_name_the_packet_option() -> None:
    for command in ("simulate", "compare"):
        code, out = _invoke(command, "--help")
        assert code == 0 and "--packet KEY=VALUE" in out and "commsched knobs --packet" in out
