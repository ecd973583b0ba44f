"""Start one process per rank on a testbed and wait for all of them, bounded in time.

A worker that exits with an error ends the launch: its peers get ``fail_grace_s``
to notice (the runtime raises ``RuntimeCommError`` within its own timeout
when a peer dies) and are then killed; the error names the first rank that
failed and quotes the end of its log. A launch that outlives ``timeout_s``
is killed and reported as a hang, naming the ranks still running.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from commsched.testbed.base import Testbed
from commsched.testbed.system import TestbedError

LOG_TAIL_LINES = 25


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in tail) or "    (empty log)"


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"exited with status {code} ({signal.Signals(code - 128).name})"
    return f"exited with status {code}"


def run_workers(
    bed: Testbed,
    argv: list[str],
    *,
    log_dir: Path,
    timeout_s: float,
    ranks: Sequence[int] | None = None,
    name: str = "launch",
    launch: int = 0,
    fail_grace_s: float = 15.0,
    poll: Callable[[], None] | None = None,
    poll_s: float = 0.25,
    extra_env: dict[str, str] | None = None,
) -> None:
    """Run ``argv`` in the worker slots ``ranks`` (default: all), as ranks 0.. of a world of ``len(ranks)``.

    Each rank gets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and
    ``GLOO_SOCKET_IFNAME`` from the testbed, plus ``extra_env``; its output goes to
    ``log_dir/<name>.rank<r>.log``. ``poll`` is called every ``poll_s`` while
    waiting (progress display). Returns when every rank exited with status 0;
    raises :class:`TestbedError` otherwise, after killing what still runs.
    """
    ranks = list(range(bed.workers)) if ranks is None else list(ranks)
    log_dir.mkdir(parents=True, exist_ok=True)
    port = bed.master_port(launch)
    logs = {r: log_dir / f"{name}.rank{r}.log" for r in ranks}
    procs = {}
    for world_rank, r in enumerate(ranks):
        env = {**bed.env(r, world_rank, len(ranks), ranks[0], port), **(extra_env or {})}
        procs[r] = bed.spawn(bed.command(r, argv), env, logs[r])
    start = time.monotonic()
    failures: list[tuple[int, int]] = []  # (rank, exit status) in the order they were seen
    first_failure_at: float | None = None
    ok = False
    try:
        while True:
            if poll is not None:
                poll()
            codes = {r: p.poll() for r, p in procs.items()}
            for r, code in codes.items():
                if code not in (None, 0) and all(r != f for f, _ in failures):
                    failures.append((r, code))
                    first_failure_at = first_failure_at or time.monotonic()
            running = [r for r, code in codes.items() if code is None]
            if not running:
                break
            now = time.monotonic()
            if first_failure_at is not None and now - first_failure_at > fail_grace_s:
                break
            if now - start > timeout_s:
                tails = "\n".join(f"  rank {r}, last lines:\n{log_tail(logs[r], 8)}" for r in running)
                raise TestbedError(
                    f"{name}: rank(s) {', '.join(map(str, running))} still running after {timeout_s:g} s "
                    f"(hung or far slower than expected); killed.\n{tails}"
                )
            time.sleep(poll_s)
        if poll is not None:
            poll()
        if failures:
            rank, code = failures[0]
            others = [
                f"rank {r} {_describe_exit(c)}" if c is not None else f"rank {r} was still running (killed)"
                for r, c in ((r, procs[r].poll()) for r in ranks if r != rank)
            ]
            echoes = "".join(
                f"\n  rank {r}, last line:\n{log_tail(logs[r], 1)}"
                for r in ranks
                if r != rank and procs[r].poll() not in (None, 0)
            )
            raise TestbedError(
                f"{name}: rank {rank} {_describe_exit(code)}; {'; '.join(others) or 'no other ranks'}.\n"
                f"  rank {rank}, last lines of {logs[rank]}:\n{log_tail(logs[rank])}{echoes}"
            )
        ok = True
    finally:
        if not ok:
            bed.kill_workers()
