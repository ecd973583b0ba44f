"""What a testbed is: where workers run, how rank r is started and with which environment; it owns their processes.

:class:`Testbed` is the interface the launcher (:func:`commsched.testbed.launch.run_workers`) uses;
:class:`~commsched.testbed.netns.NetnsTestbed` and :class:`~commsched.testbed.loopback.LoopbackTestbed`
fill it in. It starts every worker in a session of its own and kills them all on close.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from commsched.testbed.commands import LinkShape

#: Where a testbed says what it did (one line a call).
Log = Callable[[str], None]


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
