"""``commsched.testbed``: an emulated cluster on one machine, for real measurements.

N worker processes, each in its own network namespace, joined by veth pairs
to a Linux bridge that lives in a namespace of its own; every link shaped with
``tc`` (rate with ``tbf`` in both directions; delay and jitter with ``netem``
where the kernel has it) and random loss dropped by an nftables rule as
frames enter the bridge. Workers rendezvous with gloo across the
namespaces (``MASTER_ADDR`` = rank 0's address, ``GLOO_SOCKET_IFNAME`` = the
worker's veth). Everything is removed on exit, error, Ctrl-C or SIGTERM;
leftovers of killed runs are removed by the next run. Without root it falls
back to plain processes on 127.0.0.1, unshaped, and says so.
:mod:`commsched.testbed.switch` makes the bridge ports commodity-switch ports
(strict priority by DSCP; past a queue threshold ECT marked and the rest
dropped, by tc's RED or by a virtual queue in nftables), and
``NetnsTestbed(n, paths=2)`` gives two bridges to spray over (docs/testbed.md).

Workers that differ (:class:`HeteroTestbed`): per-worker CPU speed through
cgroups (:class:`CpuShare`: cores and a quota) and per-worker link shapes.

    with open_testbed(4, LinkShape(rate_bps=10**9)) as bed:
        run_workers(bed, [sys.executable, "-m", "my.worker"], log_dir=Path("logs"), timeout_s=600)

``commsched bench`` (:mod:`commsched.bench.run`) runs training on it.
"""

from commsched.testbed.base import Testbed
from commsched.testbed.cgroups import (
    CpuCgroups,
    CpuShare,
    cgroup_objects,
    cgroups_unavailable_reason,
    remove_cgroup_leftovers,
)
from commsched.testbed.cleanup import find_leftovers, project_objects, remove_leftovers
from commsched.testbed.commands import Layout, LinkShape, format_rate, parse_rate
from commsched.testbed.hetero import HeteroTestbed
from commsched.testbed.launch import run_workers
from commsched.testbed.loopback import LoopbackTestbed, open_testbed
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.switch import SwitchShape, apply_switch, switch_unavailable_reason
from commsched.testbed.system import TestbedError, netns_unavailable_reason

__all__ = [
    "CpuCgroups",
    "CpuShare",
    "HeteroTestbed",
    "Layout",
    "LinkShape",
    "LoopbackTestbed",
    "NetnsTestbed",
    "SwitchShape",
    "Testbed",
    "TestbedError",
    "apply_switch",
    "cgroup_objects",
    "cgroups_unavailable_reason",
    "find_leftovers",
    "format_rate",
    "netns_unavailable_reason",
    "open_testbed",
    "parse_rate",
    "project_objects",
    "remove_cgroup_leftovers",
    "remove_leftovers",
    "run_workers",
    "switch_unavailable_reason",
]
