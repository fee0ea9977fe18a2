# Set-up and the two commands the README opens with. Everything lives in .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel of torch; a GPU user installs their own torch into .venv first (see README).
TORCH ?= torch==2.13.0

.PHONY: setup demo demo-grpo test test-quick bench clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/omnigym train ppo
	$(BIN)/omnigym train grpo

demo-grpo: setup
	$(BIN)/omnigym train grpo

test: setup
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests

test-quick: setup  # the inner loop: everything but the slow learning tests
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow" tests

bench: setup
	$(BIN)/python bench/cartpole_vs_anchors.py

clean:
	rm -rf $(VENV) runs
