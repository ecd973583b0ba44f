"""The README's example runs as documented (torchrun, 2 processes) and trains like PyTorch DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multiproc
def test_example_train_runs_under_torchrun_and_matches_torch_ddp(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "examples" / "train.py"), "--policy", "dear", "--model", "transformer",
        "--iters", "6", "--warmup", "3", "--batch", "4", "--check", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["policy"] == "dear" and result["world_size"] == 2
    assert result["iteration_ms"] > 0
    # float32 summation order only (see tests/runtime/test_equivalence.py)
    assert result["max_param_diff_vs_torch_ddp"] < 1e-5
