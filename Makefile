# commsched: the two commands are `make demo` and `make test` (both set up everything first).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build of torch; a bare `pip install torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup testbed-tools demo test lint bench clean

$(BIN)/commsched: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $@

setup: $(BIN)/commsched testbed-tools

## As root: nftables and ethtool from the distribution when missing (the namespace testbed's switch ports).
testbed-tools:
	@scripts/testbed_tools.sh

## Rank every policy on ResNet-50 / 64 V100s by simulation, then train for real here: policy="auto" vs PyTorch DDP.
demo: setup
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/mypy

## Lint, type-check and the whole test suite.
test: lint
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/sim_speed.py
	$(BIN)/python benchmarks/collectives.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache src/*.egg-info
