# Every target bootstraps from a bare machine with only python3: uv is installed with pip when it
# is missing, and the locked environment is synced into .venv before anything runs.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(PYTHON) -m uv
RUN := $(UV) run --frozen --no-sync
STAMP := .venv/.synced
# The package with its hot path compiled by mypyc (scripts/compile_core.py), as a built wheel
# ships it. Tests and benchmarks import it from here; the editable install stays plain Python.
COMPILED := build/compiled
# The tests of the compiled modules, run once more against the plain sources (what an editable
# install, or a machine without a C compiler, runs).
CORE_TESTS := tests/test_stats.py tests/test_limits.py tests/test_graph.py \
	tests/test_graph_invariants.py tests/test_graph_threads.py tests/test_context.py \
	tests/test_context_concurrency.py tests/test_context_ledger.py tests/test_executor.py \
	tests/test_sinks.py

.PHONY: system-deps bootstrap-uv all demo test lint typecheck fmt bench clean env compiled

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

env: $(STAMP)

demo: $(STAMP)
	$(RUN) python -m ampmeter demo

lint: $(STAMP)
	$(RUN) ruff check src tests bench scripts hatch_build.py

# The second run checks the sources as the compile sees them (src/ampmeter/_argtypes.py).
typecheck: $(STAMP)
	$(RUN) mypy --strict src
	$(RUN) mypy --strict --platform ampmeter-mypyc src

compiled: $(STAMP)
	@$(RUN) python scripts/compile_core.py $(COMPILED)

system-deps:
	@bash scripts/system-deps.sh

# The wheel-building tests find uv where bootstrap-uv put it (maybe not on PATH).
test: lint typecheck system-deps compiled
	PYTHONPATH=$(COMPILED) AMPMETER_EXPECT_COMPILED=1 \
		AMPMETER_UV="$$($(PYTHON) -c 'import uv; print(uv.find_uv_bin())')" $(RUN) pytest
	$(RUN) pytest -q $(CORE_TESTS)

bench: compiled
	PYTHONPATH=$(COMPILED) AMPMETER_EXPECT_COMPILED=1 $(RUN) python bench/run.py $(if $(QUICK),--quick,)

fmt: $(STAMP)
	$(RUN) ruff check --fix src tests bench
	$(RUN) ruff format src tests bench

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache build dist
