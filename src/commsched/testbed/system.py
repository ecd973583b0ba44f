"""Running the system's network tools (``ip``, ``tc``, ``nft``, ``ethtool``), bounded in time, with clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from commsched.errors import CommschedError
from commsched.testbed.commands import PREFIX

COMMAND_TIMEOUT_S = 30.0

_IPROUTE2 = "come with iproute2 (Debian/Ubuntu: apt-get install iproute2; Fedora/RHEL: dnf install iproute)"
#: How to get each tool the testbed runs.
TOOL_HINTS = {
    "ip": f"`ip` and `tc` {_IPROUTE2}",
    "tc": f"`ip` and `tc` {_IPROUTE2}",
    "nft": "`nft` comes with nftables (Debian/Ubuntu: apt-get install nftables; Fedora/RHEL: dnf install nftables); "
    "`make setup` installs it when run as root",
    "ethtool": "`ethtool`: apt-get install ethtool (Debian/Ubuntu), dnf install ethtool (Fedora/RHEL)",
}


class TestbedError(CommschedError, RuntimeError):
    """The emulated cluster could not be built, shaped, or a worker failed or hung."""

    __test__ = False  # not a pytest test class


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_command(
    argv: list[str], *, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S, stdin_text: str | None = None
) -> str:
    """Run one command, bounded by ``timeout_s``, ``stdin_text`` on its input; return its stdout.

    Failure -> TestbedError naming the command, its exit status and its stderr.
    """
    try:
        proc = subprocess.run(argv, input=stdin_text, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    except FileNotFoundError:
        raise TestbedError(f"`{argv[0]}` not found; {TOOL_HINTS.get(argv[0], 'install it')}") from None
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def missing_tools() -> list[str]:
    return [tool for tool in ("ip", "tc") if shutil.which(tool) is None]


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (None when they can): not root, tools missing, no permission."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root, e.g. with sudo"
    missing = missing_tools()
    if missing:
        return f"{' and '.join(missing)} not found; {TOOL_HINTS['ip']}"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        run_command(["ip", "netns", "add", probe])
    except TestbedError as exc:
        return f"cannot create a network namespace: {exc}"
    run_command(["ip", "netns", "del", probe], check=False)
    return None
