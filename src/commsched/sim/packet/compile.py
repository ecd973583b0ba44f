"""Compile the packet core and DLCP (state machines, data path) to C with mypyc, in place (:mod:`commsched._compiled`).

    python -m commsched.sim.packet.compile          # about 5 minutes; needs mypy (mypyc) and a C compiler
    python -m commsched.sim.packet.compile --clean  # back to pure Python

Why: the pure-Python core runs 0.5-0.7 M packet events/s on one core, with
a flat profile (heap operations, enqueue, transmit and ACK handling each
5-10 %), so tuning cannot double it; the same source compiled by mypyc runs
1.1-1.7 M/s on the same machine (``benchmarks/packet_speed.py``; numbers in
docs/simulator.md). DLCP runs its state machines per datagram
(``transport/dlcp/protocol.py`` and ``rate.py``, driven by
``sim/packet/dlcp.py``), about half of a DLCP simulation's time in pure
Python, so they are compiled in the same group; the UDP link imports the
same extension modules. The link's own per-datagram work (``wire``, ``udp``,
``slots``, ``control``, ``inbound``, ``outbound``, ``engine``) is compiled with
them: its I/O thread is pure Python per datagram, and compiled it used 9 %
less CPU in training and moved 1.2-1.6x the datagrams per CPU second
(BENCHMARKS.md, "DLCP's data path compiled"). Compiling keeps one source of
truth: the transports stay the clock-free state machines, not a second copy
in another language.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

from commsched._compiled import MODULES, RECORD, SRC, digest, extensions, source


def clean() -> None:
    for name in MODULES:
        for path in extensions(name):
            path.unlink()
    for path in SRC.glob("*__mypyc*"):
        path.unlink()
    RECORD.unlink(missing_ok=True)
    shutil.rmtree(SRC / "build", ignore_errors=True)


def build() -> None:
    clean()
    files = [str(source(name).relative_to(SRC)) for name in MODULES]
    subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=SRC, check=True)
    shutil.rmtree(SRC / "build", ignore_errors=True)
    RECORD.write_text(json.dumps({name: digest(name) for name in MODULES}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="compile the packet core and DLCP's state machines and data path")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    if args.clean:
        clean()
    else:
        build()
        print(f"compiled {', '.join(MODULES)}")


if __name__ == "__main__":
    main()
