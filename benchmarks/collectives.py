"""Time gloo's collectives against the ring ops of ``commsched.transport.collectives``.

    python benchmarks/collectives.py --world 2 4 --sizes-mib 1 4 16 32

Spawns ``world`` processes on 127.0.0.1 (gloo, one intra-op thread each) and,
for each buffer size S, times: gloo ``all_reduce`` of S, gloo
``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (through their 2.13
names), and the ring reduce-scatter and all-gather of ``Collectives(ring=True)``.
One sample is the slowest rank's time for one op, after a barrier; the table
shows the median over ``--repeats`` samples, in milliseconds, and the cost of
a decoupled all-reduce (reduce-scatter + all-gather) relative to ``all_reduce``
(1.0 is what a bandwidth-optimal pair costs, on paper):

    gloo RS+AG / AR       the backend alone (``ring=False``)
    ring RS+gloo AG / AR  ring reduce-scatter only
    ring RS+AG / AR       both ring, what ``ring=None`` picks on gloo

Every op's result is checked against ``all_reduce`` before timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commsched._sockets import free_port
from commsched.transport.collectives import Collectives

OPS = ("all_reduce", "gloo_RS", "gloo_AG", "ring_RS", "ring_AG")
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _time_ops(ops: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, float]:
    """Median over repeats of the slowest rank's time per op, in ms.

    The ops take turns within each repeat (in a rotating order), so load from
    elsewhere on the machine spreads over all of them alike.
    """
    names = list(ops)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + repeats):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            dist.barrier()
            t0 = time.perf_counter()
            ops[name]()
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i >= warmup:
                samples[name].append(elapsed.item() * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def _ops(
    coll: Collectives, data: torch.Tensor, flat: torch.Tensor, shard: torch.Tensor
) -> dict[str, Callable[[], object]]:
    return {
        "all_reduce": lambda: dist.all_reduce(flat),
        "gloo_RS": lambda: _reduce_scatter(shard, data),
        "gloo_AG": lambda: _all_gather(flat, shard),
        "ring_RS": lambda: coll.reduce_scatter(data, shard).wait(),
        "ring_AG": lambda: coll.all_gather(shard, flat).wait(),
    }


def _rank_main(rank: int, world: int, port: int, sizes_mib: list[int], repeats: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    coll = Collectives(ring=True)
    rows = []
    for mib in sizes_mib:
        numel = mib * 2**20 // 4 // world * world
        gen = torch.Generator().manual_seed(1000 * rank + mib)
        data = torch.randn(numel, generator=gen)
        flat, shard = data.clone(), torch.empty(numel // world)

        expected = data.clone()
        dist.all_reduce(expected)
        coll.reduce_scatter(data, shard).wait()
        torch.testing.assert_close(shard, expected.chunk(world)[rank], rtol=1e-5, atol=1e-5 * world)
        coll.all_gather(shard, flat).wait()
        torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-5 * world)

        rows.append((mib, _time_ops(_ops(coll, data, flat, shard), repeats, warmup=2)))
    coll.close()
    if rank == 0:
        out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, sizes_mib: list[int], repeats: int) -> list[tuple[int, dict[str, float]]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, sizes_mib, repeats, out)) for r in range(world)]
    for p in procs:
        p.start()
    rows = out.get(timeout=1800)
    for p in procs:
        p.join()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, gloo on 127.0.0.1, {os.cpu_count()} CPUs; median ms of the slowest rank")
    print()
    print(
        "| world | MiB | all_reduce | gloo RS | gloo AG | ring RS | ring AG "
        "| gloo RS+AG / AR | ring RS+gloo AG / AR | ring RS+AG / AR |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for world in args.world:
        for mib, t in run(world, args.sizes_mib, args.repeats):
            ar = t["all_reduce"]
            print(
                f"| {world} | {mib} | {ar:.1f} | {t['gloo_RS']:.1f} | {t['gloo_AG']:.1f} | {t['ring_RS']:.1f} "
                f"| {t['ring_AG']:.1f} | {(t['gloo_RS'] + t['gloo_AG']) / ar:.2f} "
                f"| {(t['ring_RS'] + t['gloo_AG']) / ar:.2f} | {(t['ring_RS'] + t['ring_AG']) / ar:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
