"""Compile the packet core (fabric, transports, connections) to C with mypyc, in place.

    python -m commsched.sim.packet.compile          # about 2 minutes; needs mypy (mypyc) and a C compiler
    python -m commsched.sim.packet.compile --clean  # back to pure Python

Why: the pure-Python core runs 0.5-0.7 M packet events/s on one core, with
a flat profile (heap operations, enqueue, transmit and ACK handling each
5-10 %), so tuning cannot double it; the same source compiled by mypyc runs
1.1-1.7 M/s on the same machine (``benchmarks/packet_speed.py``; numbers in
docs/simulator.md). Compiling keeps one source of truth: the transports stay
the clock-free state machines in ``transport.py``, not a second copy in
another language.

The extension modules sit next to the sources and take precedence on import.
The hashes of the compiled sources are written to ``_compiled.json``; if a
source has changed since, :mod:`commsched.sim.packet` loads the pure-Python
modules instead and warns (``_core.stale``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from commsched.sim.packet._core import HERE, MODULES, RECORD, SRC, digest


def clean() -> None:
    for name in MODULES:
        for path in [*HERE.glob(f"{name}.*.so"), *HERE.glob(f"{name}.*.pyd")]:
            path.unlink()
    for path in SRC.glob("*__mypyc*"):
        path.unlink()
    RECORD.unlink(missing_ok=True)
    shutil.rmtree(SRC / "build", ignore_errors=True)


def build() -> None:
    clean()
    files = [str(Path("commsched/sim/packet") / f"{name}.py") for name in MODULES]
    subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=SRC, check=True)
    shutil.rmtree(SRC / "build", ignore_errors=True)
    RECORD.write_text(json.dumps({name: digest(name) for name in MODULES}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="compile the packet core with mypyc, in place")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    if args.clean:
        clean()
    else:
        build()
        print(f"compiled {', '.join(MODULES)} in {HERE}")


if __name__ == "__main__":
    main()
