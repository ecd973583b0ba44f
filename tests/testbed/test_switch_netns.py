"""Live switch ports: priority, ECN marks and drops under incast, random loss, two bridges, offloads off.

Needs root and iproute2 (skipped otherwise, with the reason). ``aqm="red"``
also needs sch_prio and sch_red in the kernel and is skipped, with the
missing options named, where it lacks them; ``aqm="virtual"`` and loss need
nftables: skipped where the kernel lacks its bridge family, a failure where
only the ``nft`` command is missing (``make setup`` installs it as root).
Every test builds its own namespaces, sends a bounded number of packets for
about a second, and removes everything even when it fails (``NetnsTestbed``
deletes its namespaces, and the nftables tables with them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from commsched.testbed import NetnsTestbed, TestbedError, netns_unavailable_reason, project_objects
from commsched.testbed.commands import LinkShape
from commsched.testbed.nft import parse_counters
from commsched.testbed.switch import (
    DSCP_IMPORTANT,
    DSCP_UNIMPORTANT,
    ECN_ECT0,
    ECN_NOT_ECT,
    SwitchShape,
    apply_switch,
    bridge_bytes,
    disable_offloads,
    port_commands,
    port_counters,
    switch_unavailable_reason,
    tos_byte,
)
from commsched.testbed.system import run_command

_REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}")]

RATE_BPS = 20 * 10**6  # ~1730 frames/s of 1442 bytes: enough to congest from Python, cheap on a shared CPU
PAYLOAD_BYTES = 1400

# send DST[,DST2..] PORT TOS COUNT BURST INTERVAL_S TAG: COUNT datagrams in bursts, round-robin over DSTs;
#   a late burst does not make the next one bigger (the schedule restarts from now).
# recv PORT TOTAL_S IDLE_S: count datagrams and CE marks (IP_RECVTOS) per tag; print JSON.
TRAFFIC = textwrap.dedent(
    """
    import json, socket, sys, time
    IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
    def send(dsts, port, tos, count, burst, interval_s, tag):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        payload, sent, t = bytes([tag]) + bytes(PAD_BYTES), 0, time.monotonic()
        while sent < count:
            for _ in range(min(burst, count - sent)):
                s.sendto(payload, (dsts[sent % len(dsts)], port))
                sent += 1
            t = max(t + interval_s, time.monotonic())
            time.sleep(max(0.0, t - time.monotonic()))
    def recv(port, total_s, idle_s):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        s.bind(("0.0.0.0", port))
        s.settimeout(0.05)
        print("ready", flush=True)
        counts, end, last = {}, time.monotonic() + total_s, None
        while time.monotonic() < end and (last is None or time.monotonic() - last < idle_s):
            try:
                data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(1))
            except socket.timeout:
                continue
            last = time.monotonic()
            c = counts.setdefault(str(data[0]), {"pkts": 0, "bytes": 0, "ce": 0})
            c["pkts"] += 1
            c["bytes"] += len(data)
            c["ce"] += bool(anc) and anc[0][2][0] & 3 == 3
        print(json.dumps(counts), flush=True)
    a = sys.argv[2:]
    if sys.argv[1] == "send":
        send(a[0].split(","), int(a[1]), int(a[2]), int(a[3]), int(a[4]), float(a[5]), int(a[6]))
    else:
        recv(int(a[0]), float(a[1]), float(a[2]))
    """
).replace("PAD_BYTES", str(PAYLOAD_BYTES - 1))


def _mine() -> list[str]:
    return project_objects(f"csb-{os.getpid()}-")


def _best_aqm() -> str:
    return "red" if switch_unavailable_reason(SwitchShape(rate_bps=RATE_BPS, aqm="red")) is None else "virtual"


def _skip_unless_buildable(shape: SwitchShape) -> None:
    """Skip where the kernel lacks a feature; a missing `nft` command is a set-up error, not a skip."""
    reason = switch_unavailable_reason(shape)
    if reason is not None:
        assert "not installed" not in reason, reason
        pytest.skip(f"testbed: {reason}")


@contextmanager
def _receiver(bed: NetnsTestbed, rank: int, script: Path, total_s: float = 8.0) -> Iterator[dict[str, dict[str, int]]]:
    """A UDP receiver in ``rank``'s namespace; the dict is filled with its counts when the block ends."""
    argv = [sys.executable, str(script), "recv", "5000", str(total_s), "0.5"]
    proc = subprocess.Popen(bed.command(rank, argv), stdout=subprocess.PIPE, text=True)
    counts: dict[str, dict[str, int]] = {}
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield counts
        out, _ = proc.communicate(timeout=total_s + 5)
        counts.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        proc.kill()
        proc.wait()


def _send(bed: NetnsTestbed, rank: int, script: Path, dsts: list[str], *args: object) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(script), "send", ",".join(dsts), "5000", *map(str, args)]
    return subprocess.Popen(bed.command(rank, argv))


@pytest.mark.parametrize("aqm", ["red", "virtual", "taildrop"])
def test_high_priority_flow_keeps_the_congested_port_and_the_low_one_is_dropped(aqm: str, tmp_path: Path) -> None:
    shape = SwitchShape(rate_bps=RATE_BPS, queue_pkts=10, aqm=aqm)  # type: ignore[arg-type]
    _skip_unless_buildable(shape)
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC)
    # worker 0: ECT(0) + EF, 1000 pkt/s in bursts of 24 (58 % of the port, bursts past K = 10);
    # worker 1: not-ECT + CS1, 2000 pkt/s (115 %): both into worker 2's port, 1.73x its rate.
    with NetnsTestbed(3, log=lambda m: None) as bed:
        apply_switch(bed, shape)
        dst = [bed.layout.address(2)]
        with _receiver(bed, 2, script) as got:
            start = time.monotonic()
            high = _send(bed, 0, script, dst, tos_byte(DSCP_IMPORTANT, ECN_ECT0), 1000, 24, 0.024, 1)
            low = _send(bed, 1, script, dst, tos_byte(DSCP_UNIMPORTANT, ECN_NOT_ECT), 2000, 4, 0.002, 2)
            assert high.wait(20) == 0 and low.wait(20) == 0
            send_s = time.monotonic() - start
        bands = port_counters(bed, 2, shape)
    hi, lo = got["1"], got.get("2", {"pkts": 0, "bytes": 0, "ce": 0})
    assert hi["pkts"] >= 0.97 * 1000, (hi, bands)  # strict priority: the important flow is not lost...
    assert lo["pkts"] <= 0.8 * 2000 and bands[2].dropped > 0, (lo, bands)  # ...the unimportant one is
    # ...and gets more of the port than its third of the offered load: priority, not sharing (a loaded machine
    # slows the senders and with them the congestion, so no fixed split is asked for)
    assert hi["bytes"] / (hi["bytes"] + lo["bytes"]) > 1000 / (1000 + 2000), (hi, lo)
    assert bands[0].sent_pkts >= hi["pkts"] and bands[2].sent_pkts >= lo["pkts"]
    # incast: the port toward worker 2 delivered about its rate while both sent, and no more
    delivered_bits = 8 * sum(b.sent_bytes for b in bands)
    assert 0.6 * RATE_BPS * send_s <= delivered_bits <= RATE_BPS * (send_s + 0.1) + 8 * 3 * shape.limit_pkts * 1514
    assert lo["ce"] == 0  # not-ECT packets cannot carry a mark
    if aqm in ("red", "virtual"):
        assert hi["ce"] > 0 and bands[0].marked >= hi["ce"], (hi, bands)  # marked, not dropped
        assert bands[0].early == 0 and bands[2].early > 0 and bands[2].marked == 0, bands
    else:
        assert hi["ce"] == 0 and all(b.marked == 0 for b in bands)
    assert _mine() == []


def test_packets_sprayed_over_two_paths_cross_both_bridges(tmp_path: Path) -> None:
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC)
    with NetnsTestbed(2, paths=2, log=lambda m: None) as bed:
        apply_switch(bed, SwitchShape(rate_bps=100 * 10**6, aqm=_best_aqm()))  # type: ignore[arg-type]
        before = bridge_bytes(bed)
        with _receiver(bed, 1, script) as got:
            sender = _send(bed, 0, script, [bed.layout.address(1, 0), bed.layout.address(1, 1)], 0, 400, 10, 0.005, 7)
            assert sender.wait(20) == 0
        after = bridge_bytes(bed)
    assert got["7"]["pkts"] == 400
    assert [b.bridge for b in after] == ["br0", "br1"]
    for b0, b1 in zip(before, after, strict=True):
        assert b1.from_hosts_bytes - b0.from_hosts_bytes >= 200 * PAYLOAD_BYTES
        assert b1.to_hosts_bytes - b0.to_hosts_bytes >= 200 * PAYLOAD_BYTES
    assert _mine() == []


TCP_SINK = (
    "import socket\ns=socket.create_server(('0.0.0.0',5001));print('ready',flush=True);c,_=s.accept()\n"
    "while c.recv(1<<20):pass\n"
)
TCP_SEND = "import socket,sys\ns=socket.create_connection((sys.argv[1],5001))\ns.sendall(bytes(4<<20))\ns.close()\n"


def _tx(bed: NetnsTestbed) -> tuple[int, int]:
    text = run_command(["ip", "-n", bed.layout.worker_ns(0), "-s", "-j", "link", "show", "dev", "w0"])
    tx = json.loads(text)[0]["stats64"]["tx"]
    return int(tx["bytes"]), int(tx["packets"])


@pytest.mark.parametrize("tool", ["ethtool", "ip"])
def test_with_offloads_off_tcp_reaches_the_link_in_mtu_sized_packets(tool: str) -> None:
    if tool == "ethtool" and shutil.which("ethtool") is None:
        pytest.skip("ethtool not installed (apt-get install ethtool); the ip variant covers this kernel")
    with NetnsTestbed(2, log=lambda m: None) as bed:
        assert disable_offloads(bed, tool) == tool  # type: ignore[arg-type]
        sink = subprocess.Popen(bed.command(1, [sys.executable, "-c", TCP_SINK]), stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
            bytes0, pkts0 = _tx(bed)
            send = bed.command(0, [sys.executable, "-c", TCP_SEND, bed.layout.address(1)])
            subprocess.run(send, timeout=20, check=True)
            assert sink.wait(20) == 0  # the sink saw the end of the stream: every byte has crossed w0
            bytes1, pkts1 = _tx(bed)
        finally:
            sink.kill()
            sink.wait()
    assert bytes1 - bytes0 >= 4 << 20
    assert (bytes1 - bytes0) / (pkts1 - pkts0) <= 1514  # not 64 KiB GSO super-packets
    assert _mine() == []


@pytest.mark.parametrize(
    ("what", "missing"), [("red", r"CONFIG_NET_SCH_(PRIO|RED)"), ("delay", "CONFIG_NET_SCH_NETEM")]
)
def test_a_kernel_without_red_or_netem_is_refused_naming_what_is_missing(what: str, missing: str) -> None:
    if what == "red":
        shape = SwitchShape(rate_bps=RATE_BPS, aqm="red")
    else:
        shape = SwitchShape(rate_bps=RATE_BPS, aqm="taildrop", delay_ms=1)
    if switch_unavailable_reason(shape) is None:
        pytest.skip(f"this kernel has what {what} needs: nothing to refuse")
    with NetnsTestbed(1, log=lambda m: None) as bed, pytest.raises(TestbedError, match=missing):
        apply_switch(bed, shape)
    assert _mine() == []


def test_tc_parses_every_red_port_command_even_where_the_kernel_lacks_the_qdiscs() -> None:
    """tc checks the arguments itself (exit 1 if it cannot parse them) before it asks the kernel (exit 2 if refused)."""
    shape = SwitchShape(rate_bps=10**10, queue_ms=0.1, delay_ms=1, jitter_ms=0.5, aqm="red")
    with NetnsTestbed(1, log=lambda m: None) as bed:
        for argv in port_commands(bed.layout.bridge_ns, bed.layout.bridge_port(0), shape):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert proc.returncode in (0, 2), (argv, proc.stderr)
    assert _mine() == []


LOSS_PKTS = 3000


def _lost_within_4_sigma(lost: int, loss_pct: float) -> bool:
    mean = LOSS_PKTS * loss_pct / 100
    return abs(lost - mean) <= 4 * (mean * (1 - loss_pct / 100)) ** 0.5


def test_random_loss_at_the_switch_port_and_on_the_links_matches_the_configured_rate(tmp_path: Path) -> None:
    """3000 datagrams at 5 % (switch port) and at 10 % (link): the losses are within 4 sigma of the binomial mean,
    and the nftables counters account for every datagram that did not arrive."""
    shape = SwitchShape(rate_bps=300 * 10**6, queue_pkts=100, loss_pct=5.0)
    _skip_unless_buildable(shape)
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC)
    with NetnsTestbed(2, log=lambda m: None) as bed:
        apply_switch(bed, shape, ranks=[1])  # the port toward worker 1
        with _receiver(bed, 1, script) as at_port:
            assert _send(bed, 0, script, [bed.layout.address(1)], 0, LOSS_PKTS, 10, 0.002, 3).wait(20) == 0
        port_lost = sum(b.lost for b in port_counters(bed, 1, shape))
        bed.set_shape(LinkShape(loss_pct=10.0))  # plain links again; worker 0's frames lost as they enter the bridge
        with _receiver(bed, 1, script) as on_link:
            assert _send(bed, 0, script, [bed.layout.address(1)], 0, LOSS_PKTS, 10, 0.002, 4).wait(20) == 0
        listed = run_command(["ip", "netns", "exec", bed.layout.bridge_ns, "nft", "-j", "list", "counters"])
        link_lost = parse_counters(listed)["b0_lost"].packets
    got_port, got_link = at_port["3"]["pkts"], on_link["4"]["pkts"]
    assert port_lost == LOSS_PKTS - got_port and _lost_within_4_sigma(port_lost, 5.0), (got_port, port_lost)
    assert link_lost == LOSS_PKTS - got_link and _lost_within_4_sigma(link_lost, 10.0), (got_link, link_lost)
    assert _mine() == []
