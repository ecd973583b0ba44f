"""What a compute profile is filed under: a device's short and full name, and the zoo's file name."""

from __future__ import annotations

import contextlib
import platform
import re

import torch

from commsched.workload import Workload

__all__ = ["device_names", "zoo_filename"]


def device_names(device: str | torch.device = "cpu") -> tuple[str, str]:
    """``(short, full)`` name of a device: ``("H100", "NVIDIA H100 80GB HBM3")``, ``("cpu", "AMD EPYC ...")``.

    The short name is what a profile is filed under (``resnet50.H100.json``).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        full = torch.cuda.get_device_name(dev)
        match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", full)
        short = match.group(1) if match else re.sub(r"[^A-Za-z0-9_-]+", "-", full).strip("-")
        return short, full
    full = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                full = line.split(":", 1)[1].strip()
                break
    return "cpu", full or platform.processor() or platform.machine() or "cpu"


def zoo_filename(workload: Workload) -> str:
    """The file name the zoo would ship this profile under: ``MODEL.DEVICE[.DTYPE].json``."""
    suffix = "" if workload.dtype == "fp32" else f".{workload.dtype}"
    return f"{workload.model}.{workload.device}{suffix}.json"
