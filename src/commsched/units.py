"""Unit constants, defined once. Names carry their unit (``_bytes``, ``_s``, ``_gbps``)."""

from __future__ import annotations

MiB = 1024 * 1024

#: Bits per byte, for link rates given in bit/s.
BITS_PER_BYTE = 8


def mb_to_bytes(mb: float) -> int:
    """A knob in MiB (``threshold_mb``, ``bucket_cap_mb``) as whole bytes."""
    return int(mb * MiB)


def kib_to_bytes(kib: float) -> int:
    """A knob in KiB (``fuse_kb``) as whole bytes."""
    return int(kib * 1024)


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Gbit/s (10⁹ bit/s, as links are sold) to bytes/s."""
    return gbps * 1e9 / BITS_PER_BYTE
