#!/usr/bin/env bash
# The runtime's checks on a CUDA GPU: the multi-process runtime tests with every rank on the GPU (gloo moves
# CUDA tensors through host memory; NCCL, which refuses two ranks on one GPU, in a world of one) and the
# profiler with CUDA events. Run from the repository root on a machine with a GPU and PyTorch installed:
#     bash scripts/gpu_check.sh [OUT_DIR [PYTEST_ARGS...]]
# The log and the profiles go to OUT_DIR (default: gpu-check/); PYTEST_ARGS replace the default test list.
# PROFILE_BATCHES (default "32") lists the batch sizes profiled; PYTEST_LIMIT_S (default 540) bounds pytest.
# A machine without the package index can take a missing dependency from WHEELS_DIR/<module>/ (the wheels of
# it and of what it needs, pip downloaded elsewhere). It exits with pytest's status. docs/gpu.md records what
# it gave.
set -uo pipefail
out=${1:-gpu-check}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(tests/runtime/test_cuda.py tests/runtime/test_host_memory.py tests/runtime/test_equivalence.py
        tests/runtime/test_features.py tests/runtime/test_backward_passes.py tests/runtime/test_torch_compile.py
        tests/runtime/test_replan.py tests/runtime/test_startup.py tests/runtime/test_uneven_batches.py
        tests/runtime/test_hetero_plans.py)
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COMMSCHED_TEST_DEVICE=cuda
{
    nvidia-smi -L
    if [ -n "${WHEELS_DIR:-}" ]; then  # WHEELS_DIR/<module>/*.whl: a module and what it needs
        deps=$(mktemp -d)
        trap 'rm -rf "$deps"' EXIT
        export PYTHONPATH="$PYTHONPATH:$deps"  # so that a module installed for another is seen, not installed again
        for dir in "$WHEELS_DIR"/*/; do
            [ -d "$dir" ] || continue
            module=$(basename "$dir")
            python3 -c "import $module" 2>/dev/null && continue
            echo "installing $module from $dir"
            python3 -m pip install -q --no-index --no-deps --upgrade --target "$deps" "$dir"*.whl
        done
    fi
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'nccl', torch.cuda.nccl.version())"
    for batch in ${PROFILE_BATCHES:-32}; do
        timeout 120 python3 -m commsched profile --model resnet5m --batch "$batch" --device cuda --repeats 20 \
            --out "$out/resnet5m.b$batch.cuda.json"
        echo "profile batch $batch exit $?"
    done
    timeout "${PYTEST_LIMIT_S:-540}" python3 -m pytest -v -p no:cacheprovider -o addopts=-ra --durations=10 \
        "${tests[@]}"
    status=$?
    echo "pytest exit $status"
    exit "$status"  # the script's own status (pipefail): a failed test fails the check
} 2>&1 | tee "$out/log.txt"
