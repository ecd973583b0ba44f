"""How long one full pass of Python's garbage collector stops a process that imported torch and commsched's
transports, before and after :func:`commsched._gc.freeze_long_lived` (what a link with a Python data path runs
when it opens).

    python benchmarks/gc_pause.py [--passes 3]

Prints the objects the collector tracks and each full pass's wall time, then the same after the freeze. A pass
holds the GIL: every Python thread of the process, a link's I/O thread too, waits for it.
"""

from __future__ import annotations

import argparse
import gc
import time


def full_passes(n: int) -> list[float]:
    """Wall milliseconds of ``n`` full passes, one after the other."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3, help="full passes timed before and after (default 3)")
    args = parser.parse_args()
    if args.passes < 1:
        parser.error(f"--passes must be at least 1, got {args.passes}")

    import torch  # noqa: F401  (what a training process holds)

    import commsched.transport.dlcp
    import commsched.transport.tcp  # noqa: F401
    from commsched._gc import freeze_long_lived

    tracked = len(gc.get_objects())
    before = full_passes(args.passes)
    freeze_long_lived()
    after = full_passes(args.passes)
    print(f"objects tracked: {tracked:,}; moved out of later passes by the freeze: {gc.get_freeze_count():,}")
    print("full pass, ms, before the freeze: " + ", ".join(f"{ms:.1f}" for ms in before))
    print("full pass, ms, after the freeze:  " + ", ".join(f"{ms:.1f}" for ms in after))


if __name__ == "__main__":
    main()
