"""What one blocking wait costs a thread in CPU time on this host: ``time.sleep`` and an epoll wait that times out.

Each wait puts the thread to sleep and wakes it again (a timer, a context switch; on a virtual machine, exits
to the hypervisor). A transport's I/O thread pays this once per turn of its loop, so the figure says what a
turn that finds nothing to do costs beside its Python::

    python benchmarks/wait_cost.py [--waits 2000]

Prints, per kind of wait, the CPU time (``time.process_time``) and the wall time per call.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable

import click


def per_call(wait: Callable[[], object], waits: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``wait``, over ``waits`` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(waits):
        wait()
    return 1e6 * (time.process_time() - cpu) / waits, 1e6 * (time.perf_counter() - wall) / waits


@click.command()
@click.option("--waits", type=click.IntRange(10), default=2000, show_default=True, help="calls per kind of wait")
def main(waits: int) -> None:
    epoll = select.epoll()
    quiet, _other = socket.socketpair()  # never written: every wait times out
    epoll.register(quiet, select.EPOLLIN)
    kinds: dict[str, Callable[[], object]] = {
        "sleep 100 us": lambda: time.sleep(1e-4),
        "sleep 500 us": lambda: time.sleep(5e-4),
        "epoll, 1 ms timeout": lambda: epoll.poll(1e-3),
        "epoll, no wait": lambda: epoll.poll(0),
    }
    print(f"{'wait':<22} {'CPU us/call':>12} {'wall us/call':>13}")
    for name, wait in kinds.items():
        cpu, wall = per_call(wait, waits)
        print(f"{name:<22} {cpu:>12.1f} {wall:>13.1f}")


if __name__ == "__main__":
    main()
