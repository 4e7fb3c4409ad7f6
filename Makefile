# The two commands of the README. Each sets itself up: creates .venv if missing and installs
# the package with its dependencies at the versions of constraints.txt (only again when
# pyproject.toml or constraints.txt changes).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt
PIP := $(BIN)/python -m pip install -q -c $(CONSTRAINTS)
TORCH := 2.13.0
# PyTorch's CPU-only wheels; asked only when pip's own sources (its config may name a local wheel
# folder) have no CPU build and the index answers from here.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# pip prints one warning per package for index folders this machine's pip config names but lacks:
# filtered out, pip's own exit status kept (pipefail).
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: quickstart test install clean-state

quickstart: $(STAMP)
	$(BIN)/harnessrl run pipelines/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing harnessrl and its dependencies into $(VENV) (first time: a few minutes)"
	@$(BIN)/python -m pip install -q --upgrade pip 2>&1 | $(QUIET_PIP) || echo "pip not upgraded (offline?)"
	@# The CPU build of torch first, so nothing pulls a multi-GB CUDA build on a CPU machine: from pip's
	@# own sources, else PyTorch's CPU index when it answers, else PyPI's build (CPU on macOS, CUDA on Linux).
	@$(PIP) "torch==$(TORCH)+cpu" 2>&1 | $(QUIET_PIP) \
	  || { $(BIN)/python -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null \
	       && $(PIP) --extra-index-url $(TORCH_CPU_INDEX) "torch==$(TORCH)+cpu" 2>&1 | $(QUIET_PIP); } \
	  || { echo "no CPU build of torch $(TORCH) within reach: installing PyPI's torch==$(TORCH)"; \
	       $(PIP) "torch==$(TORCH)" 2>&1 | $(QUIET_PIP); }
	@$(PIP) -e ".[dev]" 2>&1 | $(QUIET_PIP)
	@$(BIN)/python -c "import harnessrl, ray, mlflow, sentence_transformers, torch, transformers, matplotlib, fsspec"
	@touch $(STAMP)

clean-state:
	rm -rf .harnessrl
