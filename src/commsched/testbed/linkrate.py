"""What each worker's own link delivers: TCP throughput from the worker to the bridge, one worker at a time.

Between two workers a transfer runs at the slower of their two links, so
pairwise probes cannot tell a 3 Gbit/s link from a 1 Gbit/s one when every
peer is at 1 Gbit/s. Here the receiver sits on the bridge itself: the bridge
namespace gets an address (:data:`BRIDGE_ADDRESS`, on path 0) for the
duration of the probe, a receiver runs there (:mod:`commsched.testbed.probe`,
unshaped: the bridge's own port carries no qdisc), and each worker in turn
sends to it, so the transfer crosses exactly one shaped link, the worker's
egress. The sender runs outside the worker's cgroup: this measures the link,
not what a CPU-capped process makes of it (the collective probe of
``commsched bench`` measures that).

Root and a :class:`~commsched.testbed.NetnsTestbed` (or a
:class:`~commsched.testbed.HeteroTestbed` around one) are needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from commsched.testbed.base import Testbed
from commsched.testbed.commands import SUBNET_PREFIX
from commsched.testbed.hetero import HeteroTestbed
from commsched.testbed.launch import log_tail
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.system import TestbedError, run_command

#: The receiver's address inside the bridge namespace (path 0's subnet; workers use .1 to .250).
BRIDGE_ADDRESS = f"{SUBNET_PREFIX}.0.254"
PROBE_PORT = 29400
PROBE_TIMEOUT_S = 120.0
#: Bytes sent per probe: about one second at the link's rate, within these bounds.
MIN_PROBE_MIB = 4.0
MAX_PROBE_MIB = 64.0


@dataclass(frozen=True)
class LinkRate:
    """One worker's link as measured: TCP goodput worker -> bridge and the median round trip."""

    rank: int
    throughput_mbit_s: float
    rtt_ms: float
    mib: float


def probe_mib(rate_bps: int | None) -> float:
    """How much to send: about one second at ``rate_bps`` (None: unshaped), within [4, 64] MiB."""
    if rate_bps is None:
        return MAX_PROBE_MIB
    return min(MAX_PROBE_MIB, max(MIN_PROBE_MIB, rate_bps / 8 / 2**20))


def _netns(bed: Testbed) -> NetnsTestbed:
    inner = bed.inner if isinstance(bed, HeteroTestbed) else bed
    if not isinstance(inner, NetnsTestbed):
        raise TestbedError(f"per-worker link probes need network namespaces ({bed.describe()})")
    return inner


def probe_worker_links(
    bed: Testbed, log_dir: Path, rates_bps: list[int | None] | None = None, *, ranks: list[int] | None = None
) -> list[LinkRate]:
    """Each worker's link rate (worker -> bridge), one worker at a time; ``rates_bps`` sizes the transfers."""
    netns = _netns(bed)
    layout = netns.layout
    log_dir.mkdir(parents=True, exist_ok=True)
    ranks = list(range(bed.workers)) if ranks is None else ranks
    bridge = ["ip", "-n", layout.bridge_ns]
    run_command([*bridge, "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", layout.bridge_dev(0)])
    try:
        return [
            _probe_one(netns, r, log_dir, probe_mib(rates_bps[r] if rates_bps else None), PROBE_PORT + i)
            for i, r in enumerate(ranks)
        ]
    finally:
        run_command([*bridge, "addr", "del", f"{BRIDGE_ADDRESS}/24", "dev", layout.bridge_dev(0)], check=False)


def _probe_one(bed: NetnsTestbed, rank: int, log_dir: Path, mib: float, port: int) -> LinkRate:
    out = log_dir / f"linkrate-w{rank}.json"
    argv = [sys.executable, "-m", "commsched.testbed.probe", str(out), f"{mib:g}"]
    env = {**os.environ, "MASTER_ADDR": BRIDGE_ADDRESS, "MASTER_PORT": str(port)}
    logs = [log_dir / f"linkrate-w{rank}.{side}.log" for side in ("bridge", "worker")]
    commands = [
        (["ip", "netns", "exec", bed.layout.bridge_ns, *argv], {**env, "RANK": "0"}, logs[0]),
        (bed.command(rank, argv), {**env, "RANK": "1"}, logs[1]),
    ]
    procs = []
    try:
        for command, environment, log in commands:
            with open(log, "wb") as f:
                procs.append(subprocess.Popen(command, env=environment, stdout=f, stderr=subprocess.STDOUT))
        for proc, log in zip(procs, logs, strict=True):
            try:
                code = proc.wait(PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"link probe of worker {rank}: no result within {PROBE_TIMEOUT_S:g} s") from None
            if code != 0:
                raise TestbedError(f"link probe of worker {rank} failed (exit {code}):\n{log_tail(log)}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = json.loads(out.read_text())
    out.unlink()
    return LinkRate(rank, float(result["throughput_mbit_s"]), float(result["rtt_ms"]), mib)
