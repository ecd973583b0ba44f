"""The namespace testbed: worker processes in network namespaces, joined by shaped veths to a bridge.

:class:`NetnsTestbed` builds the topology of :mod:`commsched.testbed.commands`
(one namespace per worker, veth pairs to a bridge in a namespace of its own,
``tc`` shaping on every link) and removes all of it on normal exit, on error,
on Ctrl-C, SIGTERM and SIGHUP (context manager, signal handlers, ``atexit``).
Before building, it removes what killed runs left behind
(:func:`commsched.testbed.cleanup.remove_leftovers`).
:func:`link_unavailable_reason` says what this kernel lacks for a link shape.
Without root, :func:`commsched.testbed.loopback.open_testbed` falls back to plain local processes.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import threading
from types import FrameType

from commsched.testbed import kernel
from commsched.testbed.base import Log, Testbed
from commsched.testbed.cleanup import (
    cleanup_without_signals,
    kill_namespace_processes,
    project_objects,
    remove_leftovers,
)
from commsched.testbed.commands import (
    PREFIX,
    Layout,
    LinkShape,
    clear_shaping_commands,
    create_commands,
    delete_commands,
    link_loss_by_port,
    shaping_commands,
    worker_command,
)
from commsched.testbed.nft import LINKS_TABLE, SWITCH_TABLE, PortRules, link_loss_ruleset, loss_threshold
from commsched.testbed.system import TestbedError, _stderr, netns_unavailable_reason, run_command

MASTER_PORT = 29500  # inside a run's own namespaces nothing else listens


def link_unavailable_reason(shape: LinkShape) -> str | None:
    """Why links of ``shape`` cannot be built here (None when they can, or need nothing beyond ``ip``/``tc``).

    Delay and jitter need netem; loss needs nftables (its ``nft`` command and the kernel's bridge family).
    """
    features = (["netem"] if shape.needs_netem else []) + (["nft"] if shape.needs_nft else [])
    if not features:
        return None
    hints = {
        "netem": "the testbed has no other way to delay packets; rate limits (tbf) and loss (nftables) work without it"
    }
    return kernel.unavailable_reason(features, f"links of {shape.label}", hints)


class NetnsTestbed(Testbed):
    """One network namespace per worker, veths to a bridge in a namespace of its own, tc on every link.

    Building it needs root; it first removes leftovers of killed runs. Names
    are unique per process and testbed (``csb-<pid>-<n>-``). ``paths=2`` adds
    a second bridge and a second veth per worker (see :class:`Layout`), for
    per-packet spraying; ``mtu_bytes=9000`` gives every veth jumbo frames;
    :mod:`commsched.testbed.switch` turns the bridge ports into priority/ECN
    switch ports.
    """

    isolation = "netns"
    _serial = itertools.count()

    def __init__(
        self, workers: int, shape: LinkShape | None = None, *, paths: int = 1, mtu_bytes: int = 1500, log: Log = _stderr
    ) -> None:
        super().__init__(workers)
        self.log = log
        self.layout = Layout(f"{PREFIX}{os.getpid()}-{next(self._serial)}-", workers, paths, mtu_bytes)
        self._closed = False
        self._created = False
        self._old_handlers: dict[int, object] = {}
        #: the nftables rules of the switch ports, by bridge port (:func:`commsched.testbed.switch.apply_switch`)
        self.switch_rules: dict[str, PortRules] = {}
        reason = netns_unavailable_reason()
        if reason is not None:
            raise TestbedError(reason)
        remove_leftovers(log)
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._created = True
            for argv in create_commands(self.layout):
                run_command(argv)
            if shape is not None:
                self.set_shape(shape)
        except BaseException:
            self.close()
            raise

    @property
    def prefix(self) -> str:
        return self.layout.prefix

    def command(self, rank: int, argv: list[str]) -> list[str]:
        return worker_command(self.layout, rank, argv)

    def env(self, slot: int, rank: int, world: int, master_slot: int, port: int) -> dict[str, str]:
        return {
            **os.environ,
            "MASTER_ADDR": self.layout.address(master_slot),
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "GLOO_SOCKET_IFNAME": self.layout.worker_dev(slot),
        }

    def master_port(self, launch: int) -> int:
        return MASTER_PORT + launch % 1000  # a fresh port per launch: no TIME_WAIT surprises

    def set_shape(self, shape: LinkShape) -> None:
        """Replace the shaping of every link (``LinkShape()`` removes it, and any switch ports)."""
        self.check_shape(shape)
        self.clear_shaping()
        for argv in shaping_commands(self.layout, shape):
            run_command(argv)
        self.set_link_loss(dict.fromkeys(range(self.workers), shape.loss_pct))
        self.shape = shape

    def clear_shaping(self) -> None:
        """Remove every qdisc, switch port and loss rule from the links."""
        for argv in clear_shaping_commands(self.layout):
            run_command(argv, check=False)
        self.shape = LinkShape()
        self._delete_table(SWITCH_TABLE)
        self._delete_table(LINKS_TABLE)
        self.switch_rules.clear()

    def check_shape(self, shape: LinkShape) -> None:
        """Raise :class:`TestbedError` naming what this kernel (or system) lacks to build ``shape``."""
        reason = link_unavailable_reason(shape)
        if reason is not None:
            raise TestbedError(reason)

    def set_link_loss(self, loss_pct_by_rank: dict[int, float]) -> None:
        """Drop ``loss_pct_by_rank[r]`` % of the frames worker r sends, as they enter the bridge (nftables)."""
        self._delete_table(LINKS_TABLE)
        ports = link_loss_by_port(self.layout, loss_pct_by_rank)
        if any(loss_threshold(pct) for pct in ports.values()):
            run_command(
                ["ip", "netns", "exec", self.layout.bridge_ns, "nft", "-f", "-"],
                stdin_text=link_loss_ruleset(ports),
            )

    def _delete_table(self, table: str) -> None:
        if shutil.which("nft") is not None:
            run_command(["ip", "netns", "exec", self.layout.bridge_ns, "nft", "delete", "table", "bridge", table],
                        check=False)  # fmt: skip

    def _has_netem(self) -> bool:
        return kernel.has("netem")

    def qdiscs(self) -> str:
        """``tc qdisc show`` of every link, for the record."""
        out = []
        for r, p in self.layout.links():
            ns, dev, port = self.layout.worker_ns(r), self.layout.worker_dev(r, p), self.layout.bridge_port(r, p)
            out.append(run_command(["tc", "-n", ns, "qdisc", "show", "dev", dev]).strip())
            out.append(run_command(["tc", "-n", self.layout.bridge_ns, "qdisc", "show", "dev", port]).strip())
        return "\n".join(out)

    def describe(self) -> str:
        return (
            f"{self.workers} network namespaces {self.layout.worker_ns(0)}..{self.layout.worker_ns(self.workers - 1)}, "
            f"veths to {'a bridge' if self.layout.paths == 1 else f'{self.layout.paths} bridges'} in "
            f"{self.layout.bridge_ns}, links {self.shape.description}"
        )

    # ---- cleanup ----

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through __exit__ / finally blocks, which clean up

    def close(self) -> None:
        """Kill the workers, delete every namespace (and with them every link). Idempotent, signal-safe."""
        if self._closed:
            return
        self._closed = True
        with cleanup_without_signals(self._old_handlers, self.close):
            self.kill_workers()
            if self._created:
                for ns in self.layout.namespaces:
                    kill_namespace_processes(ns)
                for argv in delete_commands(self.layout):
                    run_command(argv, check=False)
                left = project_objects(self.prefix)
                if left:
                    self.log(f"testbed: could not remove {', '.join(left)}; the next run will retry")
