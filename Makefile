# The two commands of the README:
#   make lab    set up (first time: a few minutes) and open JupyterLab at work/notebooks/00_welcome.ipynb (the learner's copy)
#   make test   set up if needed and run the whole test suite (unit tests, nbval, lab checks)
# Also: make tensorboard   serve TensorBoard on 127.0.0.1:6006 over runs/ (LOGDIR=..., TB_PORT=...)
# With the conda environment of environment.yml active: ORTLAB_USE_ACTIVE_ENV=1 make test
VENV ?= .venv
export ORTLAB_VENV := $(VENV)
ifeq ($(ORTLAB_USE_ACTIVE_ENV),1)
PY := python
else
PY := $(VENV)/bin/python
endif

.PHONY: setup lab test test-portable labs execute tensorboard
setup:
	@bash tools/setup.sh

lab:
	@bash tools/lab.sh

LOGDIR ?= runs
TB_PORT ?= 6006
tensorboard:
	@ORTLAB_TB_PORT=$(TB_PORT) bash tools/tensorboard.sh $(LOGDIR)

# ruff first (pyproject's [tool.ruff]: pycodestyle and pyflakes, lines up to 120), then the suite on
# TEST_JOBS workers (pytest-xdist; every core, at most 4). --dist loadfile keeps each test file and each
# notebook on one worker, so a notebook's cells run in order in one kernel and a file's fixtures are shared.
# TEST_JOBS=0 runs everything in one process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)
test: setup
	$(PY) -m ruff check ortlab tests tools conftest.py
	$(PY) -m pytest $(XDIST)

# The notebooks again under another CPU dispatch (torch without SIMD kernels) and one thread:
# their stored outputs must reproduce on any x86-64 machine (CONTRIBUTING.md, "Reproducible outputs").
test-portable: setup
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) notebooks solutions

labs: setup
	$(PY) -m ortlab.labs build

# For contributors: re-execute notebooks in place (no timing metadata), then rebuild labs/.
NOTEBOOKS ?= notebooks/*.ipynb solutions/*.ipynb
execute: setup
	$(PY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.record_timing=False $(NOTEBOOKS)
	$(PY) -m ortlab.labs build

# On a GPU machine: every GPU check of ortlab in one run (ortlab/benchmarks/gpu_check.py, at most 7 minutes),
# one JSON record in gpu_records/, or in $(OUT) when OUT is set (the device tool sets it). Needs torch,
# Triton, CuPy and cuda-bindings, never onnxruntime, so no `setup`: the image's python3 runs it where
# there is no .venv.
GPU_PY ?= $(if $(filter 1,$(ORTLAB_USE_ACTIVE_ENV)),python,$(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3))
.PHONY: gpu-check
gpu-check:
	PYTHONPATH=. $(GPU_PY) -m ortlab.benchmarks.gpu_check $(if $(OUT),--out $(OUT))
