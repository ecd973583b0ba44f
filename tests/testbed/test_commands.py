"""The ip/tc/nft command builders and the leftover rules: pure functions, no root needed."""

from __future__ import annotations

import pytest

from commsched.testbed.commands import (
    Layout,
    LinkShape,
    clear_shaping_commands,
    create_commands,
    delete_commands,
    format_rate,
    is_stale,
    link_loss_by_port,
    owner_pid,
    parse_link_names,
    parse_netns_list,
    parse_rate,
    shaping_commands,
    worker_command,
)
from commsched.testbed.nft import link_loss_ruleset, loss_threshold


@pytest.mark.parametrize(
    ("text", "bps"),
    [("1gbit", 10**9), ("300mbit", 300 * 10**6), ("2.5Gbit", 2_500_000_000), ("64kbit", 64_000), ("none", None)],
)
def test_parse_rate_reads_tc_bit_units(text: str, bps: int | None) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["1gbps", "fast", "100", "1 gb", "10bit"])
def test_parse_rate_refuses_byte_units_and_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        parse_rate(text)


def test_format_rate_round_trips() -> None:
    for bps in (10**9, 300 * 10**6, 2_500_000_000, 64_000, 12_345):
        assert parse_rate(format_rate(bps)) == bps
    assert format_rate(None) == "none"


def test_link_shape_validates_and_labels() -> None:
    assert LinkShape().label == "none" and not LinkShape().shaped
    assert LinkShape(rate_bps=10**9).label == "1gbit"
    assert LinkShape(300 * 10**6, delay_ms=2, jitter_ms=0.5, loss_pct=0.1).label == "300mbit+2ms±0.5ms+0.1%loss"
    with pytest.raises(ValueError, match="jitter_ms"):
        LinkShape(delay_ms=1, jitter_ms=2)
    with pytest.raises(ValueError, match="loss_pct"):
        LinkShape(loss_pct=100)


def test_layout_names_fit_interface_limits_and_carry_the_owner_pid() -> None:
    layout = Layout("csb-4194304-12-", 250)
    assert layout.bridge_ns == "csb-4194304-12-br" and layout.worker_ns(3) == "csb-4194304-12-w3"
    assert all(len(layout.worker_dev(r)) <= 15 and len(layout.bridge_port(r)) <= 15 for r in range(250))
    assert owner_pid(layout.worker_ns(0)) == 4194304
    assert layout.address(0) == "10.77.0.1" and layout.address(249) == "10.77.0.250"
    with pytest.raises(ValueError, match="prefix"):
        Layout("other-", 2)
    with pytest.raises(ValueError, match="workers"):
        Layout("csb-1-0-", 0)


def test_every_link_is_created_inside_the_runs_own_namespaces() -> None:
    layout = Layout("csb-42-0-", 2)
    cmds = create_commands(layout)
    assert cmds[0] == ["ip", "netns", "add", "csb-42-0-br"]
    assert ["ip", "-n", "csb-42-0-br", "link", "add", "br0", "type", "bridge"] in cmds
    assert [
        "ip", "-n", "csb-42-0-br", "link", "add", "b1", "mtu", "1500", "type", "veth", "peer", "name", "w1",
        "mtu", "1500", "netns", "csb-42-0-w1",
    ] in cmds  # fmt: skip
    jumbo = create_commands(Layout("csb-42-0-", 2, mtu_bytes=9000))  # jumbo frames: both ends of every veth
    assert sum(c.count("9000") for c in jumbo) == 2 * 2 and all(c.count("9000") == 2 for c in jumbo if "veth" in c)
    with pytest.raises(ValueError, match="mtu_bytes: must be between 68 and 65535, got 65536"):
        Layout("csb-42-0-", 2, mtu_bytes=65536)
    assert ["ip", "-n", "csb-42-0-w1", "addr", "add", "10.77.0.2/24", "dev", "w1"] in cmds
    assert ["ip", "-n", "csb-42-0-br", "link", "set", "b0", "master", "br0"] in cmds
    # A link command without -n would act on the root namespace.
    for cmd in cmds:
        if cmd[:2] == ["ip", "-n"]:
            assert cmd[2].startswith("csb-42-0-")
        else:
            assert cmd[:3] == ["ip", "netns", "add"]
    # Namespaces exist before anything refers to them.
    added = set()
    for cmd in cmds:
        if cmd[:3] == ["ip", "netns", "add"]:
            added.add(cmd[3])
        for i, word in enumerate(cmd):
            if word in ("-n", "netns") and i + 1 < len(cmd) and cmd[i + 1].startswith("csb-"):
                assert cmd[i + 1] in added, cmd


def test_rate_is_shaped_in_both_directions_with_tbf() -> None:
    layout = Layout("csb-42-0-", 2)
    cmds = shaping_commands(layout, LinkShape(rate_bps=10**9))
    assert len(cmds) == 4
    up = ["tc", "-n", "csb-42-0-w0", "qdisc", "add", "dev", "w0", "root", "tbf", "rate", "1000000000bit"]
    down = ["tc", "-n", "csb-42-0-br", "qdisc", "add", "dev", "b0", "root", "tbf", "rate", "1000000000bit"]
    assert any(c[: len(up)] == up for c in cmds)
    assert any(c[: len(down)] == down for c in cmds)
    burst = int(cmds[0][cmds[0].index("burst") + 1])
    assert burst >= 10**9 / 8 * 0.002  # at least 2 ms of traffic


def test_delay_goes_under_the_rate_on_the_worker_side_and_loss_is_no_qdisc() -> None:
    layout = Layout("csb-42-0-", 1)
    cmds = shaping_commands(layout, LinkShape(rate_bps=300 * 10**6, delay_ms=2, jitter_ms=0.5, loss_pct=0.1))
    worker = [c for c in cmds if c[2] == "csb-42-0-w0"]
    bridge = [c for c in cmds if c[2] == "csb-42-0-br"]
    assert worker[0][7:] == ["root", "handle", "1:", "htb", "default", "1"]
    assert worker[1][3:5] == ["class", "add"] and "300000000bit" in worker[1]
    netem = worker[2]
    assert netem[netem.index("parent") + 1] == "1:1"
    assert netem[netem.index("netem") :][3:] == ["delay", "2ms", "0.5ms"]  # loss: nftables at the bridge
    assert len(bridge) == 1 and "tbf" in bridge[0] and "netem" not in bridge[0]
    assert shaping_commands(layout, LinkShape(loss_pct=1)) == []  # no qdisc for loss alone


def test_link_loss_drops_what_each_worker_sends_as_it_enters_the_bridge_on_every_path() -> None:
    ports = link_loss_by_port(Layout("csb-42-0-", 3, paths=2), {0: 1.0, 1: 0.0, 2: 0.00005})
    assert ports == {"b0": 1.0, "b0p1": 1.0, "b1": 0.0, "b1p1": 0.0, "b2": 0.00005, "b2p1": 0.00005}
    text = link_loss_ruleset(ports)
    assert text.startswith("table bridge csb_links {") and "hook forward" in text
    rules = [line.strip() for line in text.splitlines() if "numgen" in line]
    assert rules == [
        f'iifname "{port}" ether type ip numgen random mod 1000000 < 10000 counter name "{port}_lost" drop'
        for port in ("b0", "b0p1")
    ]  # 1 % of 10^6; 0 and 0.00005 % (below the 0.0001 % resolution) get no rule
    assert loss_threshold(0.1) == 1000 and loss_threshold(0.00005) == 0


def test_delay_without_rate_is_netem_alone_and_unshaped_is_nothing() -> None:
    layout = Layout("csb-42-0-", 2)
    cmds = shaping_commands(layout, LinkShape(delay_ms=1))
    assert [c[c.index("root") + 1] for c in cmds] == ["netem", "netem"]
    assert shaping_commands(layout, LinkShape()) == []
    assert len(clear_shaping_commands(layout)) == 4


def test_teardown_deletes_every_namespace_bridge_last() -> None:
    layout = Layout("csb-42-0-", 3)
    assert delete_commands(layout) == [["ip", "netns", "del", f"csb-42-0-{n}"] for n in ("w0", "w1", "w2", "br")]
    expected = ["ip", "netns", "exec", "csb-42-0-w2", "python", "-m", "x"]
    assert worker_command(layout, 2, ["python", "-m", "x"]) == expected


def test_listing_parsers() -> None:
    listing = "csb-1-0-w0 (id: 3)\ncsb-1-0-br\n\nother (id: 0)\n"
    assert parse_netns_list(listing) == ["csb-1-0-w0", "csb-1-0-br", "other"]
    text = "1: lo: <LOOPBACK,UP> mtu 65536\n7: csb-9-0-b0@if6: <BROADCAST> mtu 1500\n"
    assert parse_link_names(text) == ["lo", "csb-9-0-b0"]
    assert owner_pid("csb-123-4-w0") == 123
    assert owner_pid("csbx-123-w0") is None and owner_pid("eth0") is None


def test_stale_when_owner_dead_or_pid_reused() -> None:
    assert is_stale(created_s=100.0, owner_started_s=None)  # owner gone
    assert is_stale(created_s=100.0, owner_started_s=200.0)  # pid now belongs to a younger process
    assert not is_stale(created_s=100.0, owner_started_s=50.0)  # the owner is alive
    assert not is_stale(created_s=100.0, owner_started_s=101.0)  # clock granularity
    assert not is_stale(created_s=None, owner_started_s=1e12)  # unknown age: a live pid owns it
