#!/usr/bin/env bash
# The runtime's checks on a CUDA GPU: the multi-process runtime tests with every rank on the GPU (gloo moves
# CUDA tensors through host memory; NCCL, which refuses two ranks on one GPU, in a world of one) and the
# profiler with CUDA events. Run from the repository root on a machine with a GPU and PyTorch installed:
#     bash scripts/gpu_check.sh [OUT_DIR]
# The log and the profile go to OUT_DIR (default: gpu-check/). docs/gpu.md records what it gave.
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COMMSCHED_TEST_DEVICE=cuda
{
    nvidia-smi -L
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'nccl', torch.cuda.nccl.version())"
    timeout 540 python3 -m pytest -q -p no:cacheprovider -o addopts=-ra --durations=5 \
        tests/runtime/test_cuda.py tests/runtime/test_host_memory.py tests/runtime/test_equivalence.py \
        tests/runtime/test_features.py tests/runtime/test_backward_passes.py tests/runtime/test_torch_compile.py \
        tests/runtime/test_replan.py tests/runtime/test_startup.py tests/runtime/test_uneven_batches.py \
        tests/runtime/test_hetero_plans.py
    echo "pytest exit $?"
    timeout 120 python3 -m commsched profile --model resnet5m --batch 32 --device cuda --repeats 20 \
        --out "$out/resnet5m.cuda.json"
    echo "profile exit $?"
} 2>&1 | tee "$out/log.txt"
