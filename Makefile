# Two commands on a fresh clone: `make demo` and `make test` (`make test-corpus` scores the
# detection corpus). All create .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memwatch-installed

.PHONY: venv demo test test-corpus test-fast bench lint typecheck clean gpu-check

venv: $(STAMP)

# Re-install only when the dependency declarations change; `-e` keeps the source live.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	$(PY) -c "import torch, sys; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

demo: venv
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PY) examples/lightning_demo.py

# Two workers (pytest-xdist), a test module's tests on one worker (--dist loadfile: module
# fixtures are taken once); JOBS=1 for one process. Everything but the detection corpus's runs
# (pyproject.toml's addopts leave out `gpu` and `corpus`).
JOBS ?= 2
TEST_ENV := WANDB_MODE=offline HF_HUB_OFFLINE=1 WANDB_SILENT=true
test: venv
	$(TEST_ENV) $(PY) -m pytest -q -n $(JOBS) --dist loadfile --durations=15

# The detection corpus scored against its targets (tests/analysis/test_corpus.py, `corpus`
# marker): two runs of the design corpus, each scenario in a fresh interpreter, two at a time.
test-corpus: venv
	$(TEST_ENV) $(PY) -m pytest -q -n 0 -m corpus --durations=5 tests/analysis/test_corpus.py

# The quick loop while editing: stop at the first failure, skip the slow end-to-end tests.
test-fast: venv
	$(TEST_ENV) $(PY) -m pytest -q -x -m 'not slow and not gpu and not corpus'

bench: venv
	$(PY) benchmarks/run_all.py

# On a CUDA machine with its own python3 and nothing installed: every CUDA path, with numbers.
# Without CUDA it runs what FakeDevice can, says so, and exits 0. OUT=dir for the reports.
OUT ?= gpu-check-out
gpu-check:
	PYTHONPATH=src $(PYTHON) benchmarks/gpu_check.py --out $(OUT)

lint: venv
	$(PY) -m ruff check src tests integrations benchmarks examples

typecheck: venv
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache memwatch-out
