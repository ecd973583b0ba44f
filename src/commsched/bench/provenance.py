"""Where a bench report's numbers come from: the checkout commsched runs from and the machine it runs on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def source_info() -> dict[str, Any]:
    """The commit of the checkout commsched runs from, and its modified files (results depend on both)."""
    root = Path(__file__).resolve().parents[3]
    info: dict[str, Any] = {}
    for key, argv in (("commit", ["git", "rev-parse", "HEAD"]), ("modified", ["git", "status", "--porcelain", "-uno"])):
        try:
            out = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        info[key] = out.strip() if key == "commit" else [line[3:] for line in out.splitlines()]
    return info


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
    }
