# make train / make test on a fresh clone: bootstrap .venv, then run.
# The venv is rebuilt only when the requirements files or pyproject.toml change (stamp = their hash).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat requirements.txt requirements-onnx.txt pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(HASH)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv train test test-slow bench plan clean

$(STAMP): requirements.txt requirements-onnx.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-onnx.txt
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

test: venv
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: venv
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

clean:
	rm -rf outputs multirun lightning_logs .pytest_cache
