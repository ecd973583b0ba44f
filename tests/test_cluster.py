"""Cluster specs: validation messages, presets, derived views, YAML round-trip, ``commsched cluster``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cluster import Cluster, Device, Link, Node, ParameterServers, list_presets, load_cluster
from commsched.errors import SpecError

ETH10 = {"bandwidth_gbps": 10, "latency_us": 25}
PCIE = {"bandwidth_gbps": 58, "latency_us": 2}


def valid_spec() -> dict[str, Any]:
    """Two nodes: one in shorthand form, one with an explicit device list."""
    return {
        "name": "tiny",
        "nodes": [
            {
                "name": "a",
                "count": 2,
                "device": {"name": "V100", "memory_gib": 16},
                "nic": dict(ETH10),
                "intra": dict(PCIE),
            },
            {
                "name": "b",
                "devices": [{"name": "P100", "speed": 0.6, "memory_gib": 12}],
                "nic": dict(ETH10),
            },
        ],
    }


def problems(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        Cluster.from_dict(data)
    return info.value.problems


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = valid_spec()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def without(path: tuple[Any, ...]) -> dict[str, Any]:
    data = valid_spec()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


# ---- validation: every field, bad values, exact messages ----

BAD_VALUES = [
    (("name",), "", "name: must not be empty, got ''"),
    (("name",), 5, "name: must be a string, got 5"),
    (("description",), ["x"], "description: must be a string, got ['x']"),
    (("bogus",), 1, "bogus: is not a known field, got 1"),
    (("nodes",), [], "nodes: must list at least one node"),
    (("nodes",), "a", "nodes: must be a list, got 'a'"),
    (("nodes", 0, "name"), "", "nodes[0].name: must not be empty, got ''"),
    (("nodes", 0, "count"), 0, "nodes[0].count: must be >= 1, got 0"),
    (("nodes", 0, "count"), -2, "nodes[0].count: must be >= 1, got -2"),
    (("nodes", 0, "count"), 2.5, "nodes[0].count: must be a whole number, got 2.5"),
    (("nodes", 0, "count"), "two", "nodes[0].count: must be an integer, got 'two'"),
    (("nodes", 0, "count"), True, "nodes[0].count: must be a number, got True"),
    (("nodes", 0, "rack"), 3, "nodes[0].rack: is not a known field, got 3"),
    (("nodes", 0, "device"), "V100", "nodes[0].device: must be a mapping, got 'V100'"),
    (("nodes", 0, "device", "name"), "", "nodes[0].device.name: must not be empty, got ''"),
    (("nodes", 0, "device", "speed"), -1, "nodes[0].device.speed: must be > 0, got -1"),
    (("nodes", 0, "device", "speed"), 0, "nodes[0].device.speed: must be > 0, got 0"),
    (("nodes", 0, "device", "speed"), math.nan, "nodes[0].device.speed: must be a finite number, got nan"),
    (("nodes", 0, "device", "speed"), math.inf, "nodes[0].device.speed: must be a finite number, got inf"),
    (("nodes", 0, "device", "speed"), "fast", "nodes[0].device.speed: must be a number, got 'fast'"),
    (("nodes", 0, "device", "speed"), None, "nodes[0].device.speed: must be a number, got None"),
    (("nodes", 0, "device", "memory_gib"), 0, "nodes[0].device.memory_gib: must be > 0, got 0"),
    (("nodes", 0, "device", "memory_gib"), -16, "nodes[0].device.memory_gib: must be > 0, got -16"),
    (
        ("nodes", 0, "device", "model_speed"),
        {"resnet50": 0},
        "nodes[0].device.model_speed.resnet50: must be > 0, got 0",
    ),
    (
        ("nodes", 0, "device", "model_speed"),
        {"bert": math.nan},
        "nodes[0].device.model_speed.bert: must be a finite number, got nan",
    ),
    (("nodes", 0, "device", "model_speed"), [1.0], "nodes[0].device.model_speed: must be a mapping, got [1.0]"),
    (("nodes", 0, "device", "tflops"), 15.7, "nodes[0].device.tflops: is not a known field, got 15.7"),
    (("nodes", 1, "devices"), [], "nodes[1]: has no devices: give `devices`, or `count` + `device`"),
    (("nodes", 1, "devices", 0, "speed"), -0.5, "nodes[1].devices[0].speed: must be > 0, got -0.5"),
    (("nodes", 1, "nic", "bandwidth_gbps"), -3, "nodes[1].nic.bandwidth_gbps: must be > 0, got -3"),
    (("nodes", 1, "nic", "bandwidth_gbps"), 0, "nodes[1].nic.bandwidth_gbps: must be > 0, got 0"),
    (
        ("nodes", 1, "nic", "bandwidth_gbps"),
        math.nan,
        "nodes[1].nic.bandwidth_gbps: must be a finite number, got nan",
    ),
    (("nodes", 1, "nic", "bandwidth_gbps"), "10G", "nodes[1].nic.bandwidth_gbps: must be a number, got '10G'"),
    (("nodes", 1, "nic", "latency_us"), -1, "nodes[1].nic.latency_us: must be >= 0, got -1"),
    (("nodes", 1, "nic", "latency_us"), math.inf, "nodes[1].nic.latency_us: must be a finite number, got inf"),
    (("nodes", 1, "nic", "latency_us"), True, "nodes[1].nic.latency_us: must be a number, got True"),
    (("nodes", 1, "nic", "loss_rate"), 1, "nodes[1].nic.loss_rate: must be < 1, got 1"),
    (("nodes", 1, "nic", "loss_rate"), -0.1, "nodes[1].nic.loss_rate: must be >= 0, got -0.1"),
    (("nodes", 1, "nic", "loss_rate"), math.nan, "nodes[1].nic.loss_rate: must be a finite number, got nan"),
    (
        ("nodes", 1, "nic", "per_message_overhead_us"),
        -5,
        "nodes[1].nic.per_message_overhead_us: must be >= 0, got -5",
    ),
    (("nodes", 1, "nic", "mtu"), 9000, "nodes[1].nic.mtu: is not a known field, got 9000"),
    (("nodes", 1, "nic"), "10GbE", "nodes[1].nic: must be a mapping, got '10GbE'"),
    (("nodes", 0, "intra", "bandwidth_gbps"), 0, "nodes[0].intra.bandwidth_gbps: must be > 0, got 0"),
    (("servers",), {"count": 0, "link": ETH10}, "servers.count: must be >= 1, got 0"),
    (("servers",), {"count": 1.5, "link": ETH10}, "servers.count: must be a whole number, got 1.5"),
    (
        ("servers",),
        {"count": 1, "colocated": "maybe", "link": ETH10},
        "servers.colocated: must be true or false, got 'maybe'",
    ),
    (
        ("servers",),
        {"count": 1, "link": {"bandwidth_gbps": -1, "latency_us": 0}},
        "servers.link.bandwidth_gbps: must be > 0, got -1",
    ),
    (("servers",), {"count": 2}, "servers.link: is required for dedicated servers (colocated: false)"),
    (
        ("servers",),
        {"count": 1, "colocated": True, "link": ETH10},
        "servers.link: must be left out when colocated: a colocated server uses its node's nic",
    ),
    (
        ("servers",),
        {"count": 3, "colocated": True},
        "servers: count must be <= 2 (one colocated server per node), got 3",
    ),
    (("servers",), {"count": 1, "link": ETH10, "port": 9000}, "servers.port: is not a known field, got 9000"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD_VALUES, ids=[e for _, _, e in BAD_VALUES])
def test_bad_field_value_is_reported_with_path_and_value(path: tuple[Any, ...], value: Any, expected: str) -> None:
    assert problems(with_value(path, value)) == [expected]


MISSING = [
    (("name",), "name: is required"),
    (("nodes",), "nodes: is required"),
    (("nodes", 0, "name"), "nodes[0].name: is required"),
    (("nodes", 0, "nic"), "nodes[0].nic: is required"),
    (("nodes", 0, "intra"), "nodes[0].intra: is required: the node has 2 devices"),
    (("nodes", 0, "count"), "nodes[0]: `count` and `device` go together: give both, or a `devices` list"),
    (("nodes", 0, "device"), "nodes[0]: `count` and `device` go together: give both, or a `devices` list"),
    (("nodes", 0, "device", "name"), "nodes[0].device.name: is required"),
    (("nodes", 0, "device", "memory_gib"), "nodes[0].device.memory_gib: is required"),
    (("nodes", 1, "devices"), "nodes[1]: has no devices: give `devices`, or `count` + `device`"),
    (("nodes", 1, "nic", "bandwidth_gbps"), "nodes[1].nic.bandwidth_gbps: is required"),
    (("nodes", 1, "nic", "latency_us"), "nodes[1].nic.latency_us: is required"),
]


@pytest.mark.parametrize(("path", "expected"), MISSING, ids=[e for _, e in MISSING])
def test_missing_field_is_reported(path: tuple[Any, ...], expected: str) -> None:
    assert problems(without(path)) == [expected]


def test_devices_and_shorthand_together_are_rejected() -> None:
    data = with_value(("nodes", 1, "count"), 2)
    assert problems(data) == ["nodes[1]: give either `devices` or `count` + `device`, not both"]


def test_duplicate_node_names_name_both_nodes() -> None:
    data = with_value(("nodes", 1, "name"), "a")
    assert problems(data) == ["nodes: name 'a' is used by nodes[0] and nodes[1]"]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("nodes", 0, "count"), "2", "nodes[0].count: must be an integer, got '2'"),
        (("nodes", 0, "device", "memory_gib"), "16", "nodes[0].device.memory_gib: must be a number, got '16'"),
        (("nodes", 1, "nic", "bandwidth_gbps"), "10", "nodes[1].nic.bandwidth_gbps: must be a number, got '10'"),
    ],
)
def test_a_string_where_a_number_belongs_is_refused_not_converted(
    path: tuple[Any, ...], value: Any, expected: str
) -> None:
    assert problems(with_value(path, value)) == [expected]


def test_every_problem_is_reported_at_once() -> None:
    data = with_value(("nodes", 0, "device", "speed"), -1)
    data["nodes"][1]["nic"]["bandwidth_gbps"] = -3
    assert problems(data) == [
        "nodes[0].device.speed: must be > 0, got -1",
        "nodes[1].nic.bandwidth_gbps: must be > 0, got -3",
    ]


def test_non_mapping_document_is_rejected() -> None:
    assert problems(["a", "b"]) == ["<root>: must be a mapping of cluster fields, got list"]


def test_spec_error_message_names_the_source_and_lists_problems() -> None:
    with pytest.raises(SpecError, match=r"invalid my.yaml:\n  nodes\[1\]\.nic\.bandwidth_gbps: must be > 0, got -3"):
        Cluster.from_dict(with_value(("nodes", 1, "nic", "bandwidth_gbps"), -3), source="my.yaml")


def test_models_are_frozen() -> None:
    cluster = Cluster.from_dict(valid_spec())
    with pytest.raises(ValueError, match="frozen"):
        cluster.nodes[0].nic.bandwidth_gbps = 1  # type: ignore[misc]


# ---- derived views ----


def test_shorthand_expands_into_devices_and_ranks_go_node_by_node() -> None:
    cluster = Cluster.from_dict(valid_spec())
    assert [len(n.devices) for n in cluster.nodes] == [2, 1]
    assert cluster.nodes[0].count is None and cluster.nodes[0].device is None
    assert [(w.rank, w.node, w.local_rank, w.node_name, w.device.name) for w in cluster.workers] == [
        (0, 0, 0, "a", "V100"),
        (1, 0, 1, "a", "V100"),
        (2, 1, 0, "b", "P100"),
    ]
    assert cluster.workers[2].intra is None
    assert cluster.num_workers == 3 and cluster.num_nodes == 2


def test_shorthand_and_explicit_device_list_give_equal_clusters() -> None:
    explicit = valid_spec()
    node = explicit["nodes"][0]
    node["devices"] = [node.pop("device")] * node.pop("count")
    assert Cluster.from_dict(explicit) == Cluster.from_dict(valid_spec())


def test_worker_speed_uses_model_speed_when_listed_else_speed() -> None:
    data = with_value(("nodes", 0, "device", "model_speed"), {"resnet50": 1.4})
    cluster = Cluster.from_dict(data)
    assert cluster.worker_speed(0) == 1.0
    assert cluster.worker_speed(1, "resnet50") == 1.4
    assert cluster.worker_speed(1, "bert") == 1.0
    assert cluster.worker_speed(2, "resnet50") == 0.6
    assert cluster.worker_speeds("resnet50") == (1.4, 1.4, 0.6)


def test_workers_can_be_grouped_by_device() -> None:
    data = with_value(("nodes", 0, "device", "model_speed"), {"resnet50": 1.4, "bert": 1.1})
    cluster = Cluster.from_dict(data)
    by_device: dict[Device, list[int]] = {}
    for worker in cluster.workers:
        by_device.setdefault(worker.device, []).append(worker.rank)
    assert list(by_device.values()) == [[0, 1], [2]]
    assert len(set(cluster.workers)) == 3


def test_worker_speed_rejects_out_of_range_rank() -> None:
    cluster = Cluster.from_dict(valid_spec())
    with pytest.raises(IndexError, match="rank 3 is out of range: the cluster has 3 workers"):
        cluster.worker_speed(3)
    with pytest.raises(IndexError):
        cluster.worker_speed(-1)


def test_mixed_devices_make_a_cluster_heterogeneous() -> None:
    assert not Cluster.from_dict(valid_spec()).is_homogeneous
    same = with_value(("nodes", 1, "devices"), [{"name": "V100", "memory_gib": 16}])
    assert Cluster.from_dict(same).is_homogeneous


def test_different_nics_make_a_cluster_heterogeneous() -> None:
    same = with_value(("nodes", 1, "devices"), [{"name": "V100", "memory_gib": 16}])
    same["nodes"][1]["nic"]["bandwidth_gbps"] = 50
    assert not Cluster.from_dict(same).is_homogeneous


def test_bottlenecks_are_the_slowest_nic_and_the_slowest_ring_link() -> None:
    data = with_value(("nodes", 1, "nic", "bandwidth_gbps"), 5)
    data["nodes"][0]["intra"]["bandwidth_gbps"] = 4
    cluster = Cluster.from_dict(data)
    assert cluster.bottleneck_nic_gbps == 5
    assert cluster.ring_bottleneck_gbps == 4


def test_single_node_ring_does_not_cross_the_nic() -> None:
    data = valid_spec()
    del data["nodes"][1]
    cluster = Cluster.from_dict(data)
    assert cluster.ring_bottleneck_gbps == PCIE["bandwidth_gbps"]


def test_link_bandwidth_in_bytes_per_second() -> None:
    assert Link(bandwidth_gbps=10, latency_us=0).bandwidth_bytes_per_s == 1.25e9


def test_server_links_are_dedicated_or_the_host_nodes_nic() -> None:
    dedicated = Cluster.from_dict(
        with_value(("servers",), {"count": 2, "link": {"bandwidth_gbps": 3, "latency_us": 1}})
    )
    assert [link.bandwidth_gbps for link in dedicated.server_links] == [3, 3]
    colocated = Cluster.from_dict(with_value(("servers",), {"count": 2, "colocated": True}))
    assert colocated.server_links == (colocated.nodes[0].nic, colocated.nodes[1].nic)
    assert Cluster.from_dict(valid_spec()).server_links == ()


def test_model_copy_recomputes_workers() -> None:
    cluster = Cluster.from_dict(valid_spec())
    assert cluster.num_workers == 3
    assert cluster.model_copy(update={"nodes": cluster.nodes[:1]}).num_workers == 2


# ---- presets ----

PRESET_WORKERS = {
    "8xV100-10GbE": (8, 2),
    "64xV100-10GbE": (64, 16),
    "64xV100-100GbIB": (64, 16),
    "ec2-ps-3gbps": (8, 8),
    "hetero-8": (8, 4),
    "hetero-8-ps": (8, 4),
    "hetero-16": (16, 4),
    "hetero-64": (64, 16),
}


def test_list_presets_names_every_shipped_preset() -> None:
    assert set(list_presets()) == set(PRESET_WORKERS)


@pytest.mark.parametrize("name", sorted(PRESET_WORKERS))
def test_preset_loads_with_its_worker_and_node_count_and_a_description(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.name == name
    assert (cluster.num_workers, cluster.num_nodes) == PRESET_WORKERS[name]
    assert len(cluster.description) > 80


@pytest.mark.parametrize("name", sorted(PRESET_WORKERS))
def test_preset_round_trips_through_yaml(name: str) -> None:
    cluster = load_cluster(name)
    assert Cluster.from_yaml(cluster.to_yaml()) == cluster


def test_dear_presets_differ_only_in_the_network() -> None:
    eth, ib = load_cluster("64xV100-10GbE"), load_cluster("64xV100-100GbIB")
    assert eth.is_homogeneous and ib.is_homogeneous
    assert eth.bottleneck_nic_gbps == 10 and ib.bottleneck_nic_gbps == 100
    assert eth.nodes[0].nic.latency_us > ib.nodes[0].nic.latency_us
    assert [w.device for w in eth.workers] == [w.device for w in ib.workers]
    assert eth.nodes[0].intra == ib.nodes[0].intra


def test_hetero_8_has_heteroG_testbed_devices_speeds_and_nics() -> None:
    cluster = load_cluster("hetero-8")
    assert not cluster.is_homogeneous
    assert [w.device.name for w in cluster.workers] == ["V100"] * 2 + ["GTX-1080Ti"] * 4 + ["P100"] * 2
    assert cluster.worker_speeds() == pytest.approx(
        (1, 1, 11.3 / 15.7, 11.3 / 15.7, 0.72, 0.72, 9.3 / 15.7, 9.3 / 15.7), abs=1e-3
    )
    assert [n.nic.bandwidth_gbps for n in cluster.nodes] == [100, 50, 50, 50]
    assert cluster.bottleneck_nic_gbps == 50


def test_ec2_ps_preset_has_dedicated_servers_behind_3gbps_nics() -> None:
    cluster = load_cluster("ec2-ps-3gbps")
    assert cluster.servers is not None and not cluster.servers.colocated
    assert cluster.servers.count == 2
    assert {link.bandwidth_gbps for link in cluster.server_links} == {3}
    assert cluster.bottleneck_nic_gbps == 3


def test_unknown_preset_lists_the_known_presets() -> None:
    with pytest.raises(SpecError) as info:
        load_cluster("128xH100")
    (line,) = info.value.problems
    assert line.startswith("'128xH100' is neither a preset nor a file; presets: ")
    for name in PRESET_WORKERS:
        assert name in line


def test_missing_yaml_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_cluster(str(tmp_path / "absent.yaml"))


def test_cluster_file_is_loaded_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    Cluster.from_dict(valid_spec()).save(path)
    assert load_cluster(str(path)) == Cluster.from_dict(valid_spec())


# ---- YAML ----


def test_yaml_syntax_error_is_a_spec_error_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnodes:\n  - {name: a, count: 4\n  - name: b\n")
    with pytest.raises(SpecError) as info:
        load_cluster(str(path))
    assert info.value.source == str(path)
    (line,) = info.value.problems
    assert line == "line 4, column 9: not valid YAML (expected ',' or '}', but got ':', while parsing a flow mapping)"


def test_yaml_errors_carry_field_paths(tmp_path: Path) -> None:
    text = Cluster.from_dict(valid_spec()).to_yaml().replace("bandwidth_gbps: 10.0", "bandwidth_gbps: -3", 2)
    with pytest.raises(SpecError) as info:
        Cluster.from_yaml(text, source="mine.yaml")
    assert info.value.problems == [
        "nodes[0].nic.bandwidth_gbps: must be > 0, got -3",
        "nodes[1].nic.bandwidth_gbps: must be > 0, got -3",
    ]


def test_yaml_boolean_is_not_a_number() -> None:
    text = Cluster.from_dict(valid_spec()).to_yaml().replace("latency_us: 25.0", "latency_us: yes", 1)
    with pytest.raises(SpecError, match=r"nodes\[0\]\.nic\.latency_us: must be a number, got True"):
        Cluster.from_yaml(text)


def test_to_yaml_uses_shorthand_only_for_identical_devices() -> None:
    data = valid_spec()
    data["nodes"][1]["devices"].append({"name": "V100", "memory_gib": 16})
    data["nodes"][1]["intra"] = dict(PCIE)
    dumped = Cluster.from_dict(data).to_dict()
    assert dumped["nodes"][0]["count"] == 2 and "devices" not in dumped["nodes"][0]
    assert len(dumped["nodes"][1]["devices"]) == 2 and "count" not in dumped["nodes"][1]
    assert Cluster.from_dict(dumped) == Cluster.from_dict(data)


def _finite(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
positive = _finite(1e-6, 1e6).filter(lambda x: x > 0)
links = st.builds(
    Link,
    bandwidth_gbps=positive,
    latency_us=_finite(0, 1e4),
    loss_rate=_finite(0, 0.999),
    per_message_overhead_us=_finite(0, 1e3),
)
devices = st.builds(
    Device,
    name=names,
    speed=positive,
    model_speed=st.dictionaries(names, positive, max_size=3),
    memory_gib=positive,
)


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    node_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    nodes = []
    for name in node_names:
        if draw(st.booleans()):
            node_devices = [draw(devices)] * draw(st.integers(1, 4))
        else:
            node_devices = draw(st.lists(devices, min_size=1, max_size=3))
        intra = draw(links) if len(node_devices) > 1 or draw(st.booleans()) else None
        nodes.append(Node(name=name, devices=tuple(node_devices), nic=draw(links), intra=intra))
    servers = None
    if draw(st.booleans()):
        if draw(st.booleans()):
            servers = ParameterServers(count=draw(st.integers(1, len(nodes))), colocated=True)
        else:
            servers = ParameterServers(count=draw(st.integers(1, 8)), link=draw(links))
    return Cluster(name=draw(names), description=draw(st.text(max_size=40)), nodes=tuple(nodes), servers=servers)


@settings(max_examples=30, deadline=None)
@given(clusters())
def test_random_valid_clusters_round_trip_through_yaml_unchanged(cluster: Cluster) -> None:
    again = Cluster.from_yaml(cluster.to_yaml())
    assert again == cluster
    assert again.workers == cluster.workers


# ---- CLI ----


def invoke(*args: str) -> Any:
    from commsched.cli import cli

    return CliRunner().invoke(cli, ["cluster", *args])


def test_cli_show_prints_nodes_devices_and_links() -> None:
    result = invoke("show", "hetero-8")
    assert result.exit_code == 0, result.output
    for text in ("hetero-8", "gtx1080ti-2", "GTX-1080Ti", "0.592", "100 Gb/s", "heterogeneous"):
        assert text in result.output


def test_cli_show_yaml_prints_a_loadable_spec() -> None:
    result = invoke("show", "64xV100-10GbE", "--yaml")
    assert result.exit_code == 0, result.output
    assert Cluster.from_yaml(result.output) == load_cluster("64xV100-10GbE")


def test_cli_show_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    Cluster.from_dict(valid_spec()).save(path)
    result = invoke("show", str(path))
    assert result.exit_code == 0, result.output
    assert "P100" in result.output


def test_cli_show_unknown_preset_fails_with_the_list_and_no_traceback() -> None:
    result = invoke("show", "nope")
    assert result.exit_code == 1
    assert "'nope' is neither a preset nor a file; presets:" in result.output
    assert "Traceback" not in result.output


def test_cli_list_shows_every_preset() -> None:
    result = invoke("list")
    assert result.exit_code == 0, result.output
    for name in PRESET_WORKERS:
        assert name in result.output


@pytest.mark.parametrize("args", [(), ("show",), ("list",)])
def test_cli_help_works_everywhere(args: tuple[str, ...]) -> None:
    result = invoke(*args, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output


# ---- measured batch curves ----


def test_a_device_batch_curve_round_trips_and_is_given_per_rank_for_its_model(tmp_path: Path) -> None:
    spec = valid_spec()
    spec["nodes"][1]["devices"][0]["model_batch_ms"] = {"resnet18": {16: 300.0, 8: 170.0}}
    cluster = Cluster.from_dict(spec)
    path = tmp_path / "curve.yaml"
    cluster.save(path)
    assert load_cluster(str(path)) == cluster
    assert cluster.worker_batch_curves("resnet18") == ((), (), ((8, 170.0), (16, 300.0)))  # sorted by batch
    assert cluster.worker_batch_curves("vgg16") == cluster.worker_batch_curves() == ((), (), ())


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ({16: 300.0}, r"model_batch_ms: resnet18: needs at least 2 batch sizes, got \{16: 300.0\}"),
        ({0: 1.0, 16: 300.0}, r"model_batch_ms\.resnet18\[0\]\.\[key\]: must be > 0, got 0"),
        ({8: -1.0, 16: 300.0}, r"model_batch_ms\.resnet18\[8\]: must be > 0, got -1\.0"),
    ],
)
def test_a_bad_batch_curve_is_refused_naming_the_field(curve: dict[int, float], message: str) -> None:
    spec = valid_spec()
    spec["nodes"][1]["devices"][0]["model_batch_ms"] = {"resnet18": curve}
    with pytest.raises(SpecError, match=message):
        Cluster.from_dict(spec)
