"""How often an idle gloo process group wakes its process: one group after another, nothing sent.

    python benchmarks/gloo_idle_wakeups.py --groups 4 --seconds 2

One process (a world of 1 on gloo, rendezvous on 127.0.0.1). With the default group alone, then after
each ``dist.new_group``, it sleeps ``--seconds`` and counts how often each of its threads blocked meanwhile
(voluntary context switches, :func:`commsched.bench.threads.thread_sleeps`): every wake-up of a sleeping
thread, on a host whose cores also compute, may preempt the training thread. Prints, per number of live
groups, the sleeps per second of each thread name. gloo's ``gloo_tcp_loop`` (one per group) waits in
``epoll_wait`` with a 10 ms timeout, so each group costs about 100 wake-ups a second while idle.
"""

from __future__ import annotations

import argparse
import os
import time

import torch.distributed as dist

from commsched._sockets import free_port
from commsched.bench.threads import per_iteration, thread_sleeps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4, help="live groups to reach (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=2.0, help="idle time per reading (default: %(default)s)")
    args = parser.parse_args()
    if args.groups < 1:
        parser.error(f"--groups: must be >= 1, got {args.groups}")
    if args.seconds <= 0:
        parser.error(f"--seconds: must be > 0, got {args.seconds}")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    print("| live gloo groups | sleeps per second, by thread name |\n|---|---|")
    for live in range(1, args.groups + 1):
        if live > 1:
            dist.new_group(backend="gloo")
        before = thread_sleeps()
        time.sleep(args.seconds)
        rates = per_iteration(before, thread_sleeps(), 1, scale=1.0 / args.seconds)
        cells = ", ".join(f"{n} {v:.0f}" for n, v in sorted(rates.items(), key=lambda kv: -kv[1]) if round(v) > 0)
        print(f"| {live} | {cells} |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
