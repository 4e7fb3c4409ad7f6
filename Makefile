# The two commands of the README. Each sets itself up: creates .venv if missing and installs
# the package with its dependencies (only again when pyproject.toml changes).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pip prints one warning per package for index folders this machine's pip config names but lacks.
QUIET_PIP := grep -v "is ignored: it is neither a file nor a directory" || true

.PHONY: quickstart test install clean-state

quickstart: $(STAMP)
	$(BIN)/harnessrl run pipelines/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing harnessrl and its dependencies into $(VENV) (first time: a few minutes)"
	@($(BIN)/python -m pip install -q --upgrade pip 2>&1 | $(QUIET_PIP))
	@# A CPU build of torch first, so nothing pulls a multi-GB CUDA build on a CPU machine.
	@($(BIN)/python -m pip install -q "torch==2.13.0" 2>&1 | $(QUIET_PIP))
	@($(BIN)/python -m pip install -q -e ".[dev]" 2>&1 | $(QUIET_PIP))
	@$(BIN)/python -c "import harnessrl, ray, mlflow, sentence_transformers, torch" 
	@touch $(STAMP)

clean-state:
	rm -rf .harnessrl
