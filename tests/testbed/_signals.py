"""What the interrupted-run tests share: waiting for a signalled holder process, with a diagnosis."""

from __future__ import annotations

import signal
import subprocess

import pytest


def ended_within(proc: subprocess.Popen[str], seconds: float) -> None:
    """Fail with what the signal met (this process's SIGINT handler and mask, inherited) if it did not end."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(
            f"the holder did not end within {seconds} s; here SIGINT is {signal.getsignal(signal.SIGINT)!r}, "
            f"blocked: {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}"
        )
