# One entry point for people and CI. `make demo` and `make test` set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/turborag: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	# On a CUDA machine, install the torch build for your CUDA instead, before this step.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/turborag

setup: $(BIN)/turborag

demo: setup
	$(BIN)/turborag demo

test: setup
	$(BIN)/python -m pytest -q

test-real: setup
	$(BIN)/python -m pytest -q -m real_model

lint: setup
	$(BIN)/ruff check turborag tests scripts examples

.PHONY: setup demo test test-real lint
