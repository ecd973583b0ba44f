"""Emulated clusters on one machine: worker processes in network namespaces, or plain local processes.

:class:`NetnsTestbed` builds the topology of :mod:`commsched.testbed.commands`
(one namespace per worker, veth pairs to a bridge in a namespace of its own,
``tc`` shaping on every link) and removes all of it on normal exit, on error,
on Ctrl-C, SIGTERM and SIGHUP (context manager, signal handlers, ``atexit``).
A run that was killed outright (SIGKILL, power loss) leaves namespaces named
``csb-<pid>-...``; :func:`remove_leftovers`, called by every new testbed,
deletes those whose owner pid is dead (or was reused by a younger process)
and says so.

:class:`LoopbackTestbed` is the fallback without root: the same workers as
plain processes on 127.0.0.1, no isolation, no shaping.

Example::

    with open_testbed(4, LinkShape(rate_bps=10**9)) as bed:
        run_workers(bed, [sys.executable, "-m", "my.worker"], log_dir=tmp, timeout_s=600)
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Literal, Self

from commsched.testbed import kernel
from commsched.testbed.commands import (
    PREFIX,
    Layout,
    LinkShape,
    clear_shaping_commands,
    create_commands,
    delete_commands,
    is_stale,
    link_loss_by_port,
    owner_pid,
    parse_link_names,
    parse_netns_list,
    shaping_commands,
    worker_command,
)
from commsched.testbed.nft import LINKS_TABLE, SWITCH_TABLE, PortRules, link_loss_ruleset, loss_threshold
from commsched.testbed.system import (  # noqa: F401  (re-exported: callers import them from here)
    TestbedError,
    _stderr,
    missing_tools,
    netns_unavailable_reason,
    run_command,
)

NETNS_DIR = Path("/run/netns")
MASTER_PORT = 29500  # inside a run's own namespaces nothing else listens

Log = Callable[[str], None]
Isolation = Literal["auto", "netns", "loopback"]


# ------------------------------------------------------------------ leftovers


@contextlib.contextmanager
def cleanup_without_signals(old_handlers: dict[int, object], close: Callable[[], None]) -> Iterator[None]:
    """Run a cleanup with SIGINT, SIGTERM and SIGHUP held back (a second Ctrl-C must not cut it short);
    when it ends, give the signals their ``old_handlers`` back and drop ``close`` from ``atexit``."""
    blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
        if on_main:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
        atexit.unregister(close)
    finally:
        if on_main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)


@dataclass(frozen=True)
class Leftover:
    kind: Literal["netns", "link"]
    name: str
    owner_pid: int


def _process_start_s(pid: int) -> float | None:
    """Start time (epoch seconds) of a live process, None if there is none with this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22 counts from 1, after "pid (comm)"
    return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")


def find_leftovers() -> list[Leftover]:
    """Project namespaces and root-namespace links whose creating process is gone."""
    found = []
    for name in parse_netns_list(run_command(["ip", "netns", "list"], check=False)):
        pid = owner_pid(name)
        if pid is None:
            continue
        try:
            created: float | None = (NETNS_DIR / name).stat().st_mtime
        except OSError:
            created = None
        if is_stale(created, _process_start_s(pid)):
            found.append(Leftover("netns", name, pid))
    for name in parse_link_names(run_command(["ip", "-o", "link", "show"], check=False)):
        pid = owner_pid(name)
        if pid is not None and is_stale(None, _process_start_s(pid)):
            found.append(Leftover("link", name, pid))
    return found


def _kill_namespace_processes(ns: str) -> None:
    pids = [int(p) for p in run_command(["ip", "netns", "pids", ns], check=False).split() if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_leftovers(log: Log = _stderr) -> list[Leftover]:
    """Delete what killed runs left behind (processes inside their namespaces first), saying what."""
    found = find_leftovers()
    for item in found:
        if item.kind == "netns":
            _kill_namespace_processes(item.name)
            run_command(["ip", "netns", "del", item.name], check=False)
        else:
            run_command(["ip", "link", "del", item.name], check=False)
    if found:
        owners = ", ".join(sorted({str(i.owner_pid) for i in found}))
        names = ", ".join(i.name for i in found)
        log(f"testbed: removed leftovers of killed runs (owner pid {owners} no longer running): {names}")
    return found


def project_objects(prefix: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with ``prefix`` (to check a cleanup)."""
    names = parse_netns_list(run_command(["ip", "netns", "list"], check=False))
    names += parse_link_names(run_command(["ip", "-o", "link", "show"], check=False))
    return [n for n in names if n.startswith(prefix)]


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


# ------------------------------------------------------------------ testbeds


class Testbed:
    """Where workers run: how to start rank r, with which environment; owns its worker processes."""

    __test__ = False
    isolation: str = "none"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.shape = LinkShape()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    # ---- to override ----

    def command(self, rank: int, argv: list[str]) -> list[str]:
        raise NotImplementedError

    def env(self, slot: int, rank: int, world: int, master_slot: int, port: int) -> dict[str, str]:
        """Environment of the process in ``slot`` (a worker namespace) playing ``rank`` of ``world``."""
        raise NotImplementedError

    def master_port(self, launch: int) -> int:
        raise NotImplementedError

    def set_shape(self, shape: LinkShape) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    # ---- processes ----

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start a worker in a session of its own (so a Ctrl-C meant for us reaches it only through us)."""
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        with self._lock:
            self._procs.append(proc)
        return proc

    def kill_workers(self, grace_s: float = 3.0) -> None:
        """SIGTERM every live worker's process group, SIGKILL what is left after ``grace_s``."""
        with self._lock:
            procs, self._procs = self._procs, []
        live = [p for p in procs if p.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)
            deadline = time.monotonic() + grace_s
            for p in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.0, deadline - time.monotonic()))
            live = [p for p in live if p.poll() is None]
            if not live:
                break

    def close(self) -> None:
        self.kill_workers()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LoopbackTestbed(Testbed):
    """No root: plain local processes talking over 127.0.0.1; nothing is isolated or shaped."""

    isolation = "loopback"

    def command(self, rank: int, argv: list[str]) -> list[str]:
        return list(argv)

    def env(self, slot: int, rank: int, world: int, master_slot: int, port: int) -> dict[str, str]:
        return {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "GLOO_SOCKET_IFNAME": "lo",
        }

    def master_port(self, launch: int) -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def set_shape(self, shape: LinkShape) -> None:
        if shape.shaped:
            raise TestbedError(f"the loopback fallback cannot shape links (asked for {shape.label}); it needs root")
        self.shape = shape

    def describe(self) -> str:
        return f"{self.workers} local processes on 127.0.0.1 (loopback fallback: no namespaces, no shaping)"


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
                    _kill_namespace_processes(ns)
                for argv in delete_commands(self.layout):
                    run_command(argv, check=False)
                left = project_objects(self.prefix)
                if left:
                    self.log(f"testbed: could not remove {', '.join(left)}; the next run will retry")


def open_testbed(
    workers: int,
    shape: LinkShape | None = None,
    *,
    isolation: Isolation = "auto",
    mtu_bytes: int = 1500,
    log: Log = _stderr,
) -> Testbed:
    """A namespace testbed when possible; with ``isolation="auto"`` and no root, the loopback fallback.

    The fallback cannot shape: asking for shaping there raises :class:`TestbedError`. ``mtu_bytes`` is
    every veth's MTU (loopback's own, 65536, is larger than any).
    """
    if isolation == "netns":
        return NetnsTestbed(workers, shape, mtu_bytes=mtu_bytes, log=log)
    if isolation == "auto":
        reason = netns_unavailable_reason()
        if reason is None:
            return NetnsTestbed(workers, shape, mtu_bytes=mtu_bytes, log=log)
        log(f"testbed: {reason}; falling back to {workers} plain processes on 127.0.0.1, links NOT shaped")
    bed = LoopbackTestbed(workers)
    if shape is not None:
        bed.set_shape(shape)
    return bed
