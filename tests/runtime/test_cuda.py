"""The runtime on a GPU: NCCL, CUDA tensors, the CUDA profiler. Skipped where torch sees no GPU.

The multi-process tests run on a GPU too, every rank sharing it over gloo::

    COMMSCHED_TEST_DEVICE=cuda pytest tests/runtime/test_equivalence.py tests/runtime/test_cuda.py

(NCCL refuses two ranks on one GPU, so the NCCL check here is one rank: it runs the runtime's hooks, buffers,
agent and updates on NCCL groups and CUDA tensors, but a world of one skips the reductions themselves and has
no leader's decisions; gloo with CUDA tensors at 2 and 4 ranks covers those.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from commsched.errors import UnsupportedError
from commsched.profile import profile_model
from commsched.runtime.api import parallelize

import _models as M
import _workers as W
from conftest import spawn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "DEVICE", torch.device("cuda"))


def test_every_collective_policy_matches_torch_ddp_over_nccl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMSCHED_TEST_DEVICE", "cuda")  # read by the spawned rank
    monkeypatch.setenv("COMMSCHED_TEST_BACKEND", "nccl")
    (res,) = spawn(W.equivalence, 1, tmp_path, ["sgd", "adamw"], 6)
    assert "error" not in res and "missing" not in res, res
    compared = [k for k in res if "/" in k]
    assert {k.split("/")[0] for k in compared} == set(W.LOSSLESS) - set(W.HOST_MEMORY)
    for key in compared:
        assert res[key]["moved"] > 1e-3 and res[key]["params"] < 1e-5 and res[key]["state"] < 1e-5, (key, res[key])


@pytest.mark.usefixtures("world_of_one", "on_gpu")
@pytest.mark.parametrize("policy", W.HOST_MEMORY)
def test_host_memory_policies_are_refused_at_parallelize_on_cuda(policy: str) -> None:
    model = M.fresh()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UnsupportedError, match=r"host memory.*cuda"):
        parallelize(model, opt, policy=policy)


@pytest.mark.usefixtures("on_gpu")
def test_the_profiler_times_layers_with_cuda_events() -> None:
    model = M.fresh()
    workload = profile_model(
        model, lambda: M.batch(0, 0), torch.nn.CrossEntropyLoss(), batch_size=8, model_name="TrickyNet",
        device="cuda", warmup=2, repeats=5,
    )  # fmt: skip
    assert "CUDA events" in workload.provenance.method, workload.provenance
    times = [(layer.name, layer.forward_ms, layer.backward_ms) for layer in workload.layers]
    assert times and all(f > 0 and b > 0 for _, f, b in times), times
    assert next(model.parameters()).is_cuda
