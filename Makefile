# jobfence — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
BENCH_ARGS ?=
CHAOS_ARGS ?=

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "jobfence needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

venv: $(STAMP) ## create the virtualenv and install jobfence with its test extras

postgres-check: $(STAMP) ## make sure a PostgreSQL server can be had for the tests
	@if [ -z "$$JOBFENCE_TEST_DATABASE_URL" ]; then \
	  $(PY) -c 'from shared.embedded_pg import find_bindir; print("PostgreSQL binaries:", find_bindir())'; \
	fi

lint: $(STAMP) ## ruff and mypy over shared/ and functions/ (ruff also over tests/, bench/, demo/)
	$(VENV)/bin/ruff check shared functions tests bench demo
	$(VENV)/bin/mypy

test: lint postgres-check ## lint, type-check, and run every test on a real PostgreSQL
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP) ## run the main story end to end on embedded defaults
	$(PY) -m demo.run

bench: $(STAMP) ## run the benchmarks, write docs/BENCHMARKS.md (BENCH_ARGS="--quick" for a smoke run)
	$(PY) -m bench.run $(BENCH_ARGS)

chaos: $(STAMP) ## fault-injection run: thousands of jobs, SIGKILL/SIGTERM/SIGSTOP, DB restart; judged by the audit trail (CHAOS_ARGS="--jobs 300 --quick" for a short one)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

schema-snapshot: $(STAMP) ## regenerate tests/integration/expected_schema.txt after a migration
	JOBFENCE_UPDATE_SCHEMA_SNAPSHOT=1 $(PY) -m pytest -q tests/integration/test_migrations.py -k expected_schema

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache build *.egg-info

.PHONY: help venv postgres-check lint test demo bench chaos schema-snapshot clean
