"""``commsched.bench.task_overlap`` for real: the runtime's tasks beside the backward, on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsched.bench.task_overlap import TaskOverlap
from commsched.models import build_model

import _workers as W
from conftest import spawn

pytestmark = pytest.mark.multiproc


def test_every_round_times_the_backward_alone_and_beside_the_runtimes_tasks(tmp_path: Path) -> None:
    gradients_mib = sum(p.numel() for p in build_model("cnn", 0).parameters()) * 4 / 2**20
    results = spawn(W.task_overlap, 2, tmp_path, 3)
    for rank, result in enumerate(results):
        assert "error" not in result and "missing" not in result, result
        assert result["progress"] == [0, 1, 2, 3, 4]  # the warm-up round, one untimed round, 3 timed
        times = TaskOverlap.from_dict(result["rounds"], f"rank {rank}")
        assert len(times.alone_ms) == len(times.beside_ms) == 3 and min(times.alone_ms) > 0
        # cnn's 2.6 MiB of gradients in 1 MiB buckets: tasks start while the backward still runs, and the
        # bytes counted beside it are at most all of them
        assert min(times.tasks) >= 1, times
        assert 0 < max(times.mib) <= gradients_mib + 1e-9, times
        assert times.ms_per_task(0.0) is not None
