# make train / make test on a fresh clone: bootstrap .venv, then run.
# The venv is rebuilt only when the requirements files or pyproject.toml change (stamp = their hash).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat requirements.txt requirements-onnx.txt requirements-test.txt pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(HASH)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv train test test-slow lint bench plan clean

$(STAMP): requirements.txt requirements-onnx.txt requirements-test.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-onnx.txt -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

train: venv
	$(PY) train.py $(ARGS)

plan: venv
	$(PY) train.py mode=plan $(ARGS)

bench: venv
	$(PY) train.py mode=bench $(ARGS)

# Both suites run in two test processes (pytest-xdist), one file per process at a time so that
# module fixtures are built once, longest files first (tests/conftest.py), each process on one
# compute thread (docs/benchmarks.md, "The test suites' time": the slow suite went from 28 to
# 14 minutes with the changes made there). Tests marked serial measure
# throughput on a pinned core and run alone afterwards. pytest's exit 5 (nothing selected, as
# when PYTEST_ARGS names only files without serial tests) is not a failure there.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: venv
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

test-slow: venv
	$(PY) -m pytest -q -m "slow and not serial" $(XDIST) $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "slow and serial" $(PYTEST_ARGS) || test $$? -eq 5

# Lint (pyflakes, pycodestyle, import order) and the format check, configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf outputs multirun lightning_logs .pytest_cache
