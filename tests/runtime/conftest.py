"""Spawning helpers for multi-process (gloo, CPU) runtime tests."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _processes import free_port, process

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    """A gloo process group of one rank in this process, for checks that happen before any communication."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def spawn(fn: Callable[..., None], world: int, tmp_path: Path, *args: Any, timeout_s: float = 300) -> list[dict]:
    """Run ``fn(rank, world, port, out_dir, *args)`` in ``world`` processes; return each rank's JSON result."""
    port = free_port()
    procs = [process(fn, (r, world, port, str(tmp_path), *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    for r in range(world):
        f = tmp_path / f"rank{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else {"missing": f"rank {r} wrote no result"})
    return results
