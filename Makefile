# jobfence — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test files run on this many processes at once (each with its own throwaway PostgreSQL);
# most of the suite waits on leases, subprocesses and sockets, not on the CPU.
PYTEST_WORKERS ?= 2
BENCH_ARGS ?=
CHAOS_ARGS ?=

# Deploying: one image for every function, the kustomize base in manifests/.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= jobfence:$(VERSION)
NAMESPACE ?= jobfence
INSTALLATION ?=
KUBECTL ?= kubectl
DOCKER ?= docker
OVERLAY := build/deploy

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "jobfence needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

venv: $(STAMP) ## create the virtualenv and install jobfence with its test extras

# The system programs each command uses (PostgreSQL, PgBouncer, promtool, the Pushgateway,
# Chromium): installed from Debian's packages when missing and run as root, else named.
system-test system-demo system-bench: system-%:
	@devtools/system-packages.sh $*

postgres-check: $(STAMP) system-test ## make sure a PostgreSQL server (and PgBouncer) can be had for the tests
	@if [ -z "$$JOBFENCE_TEST_DATABASE_URL" ]; then \
	  $(PY) -c 'from devtools.embedded_pg import find_bindir; print("PostgreSQL binaries:", find_bindir())'; \
	fi
	@$(PY) -m devtools.pgbouncer

lint: $(STAMP) ## ruff, mypy and the import-linter contracts (the layers in docs/DEVELOPERS.md)
	$(VENV)/bin/ruff check shared functions devtools tests bench demo examples
	@$(PY) -m devtools.linktree >/dev/null  # jobfence as installed, for mypy and lint-imports
	$(VENV)/bin/mypy
	PYTHONPATH=build/src $(VENV)/bin/lint-imports

test: lint postgres-check ## lint, type-check, and run every test on a real PostgreSQL
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

demo: $(STAMP) system-demo ## run the main story end to end on embedded defaults
	$(PY) -m demo.run

# The benchmarks' own virtualenv: jobfence plus the peers it is measured against.
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[test]" -r bench/requirements.txt
	@touch $@

bench: $(BENCH_STAMP) system-bench ## run the benchmarks beside pgbench and the peers, write docs/BENCHMARKS.md (BENCH_ARGS="--quick" for a smoke run)
	$(BENCH_VENV)/bin/python -m bench.run $(BENCH_ARGS)

chaos: $(STAMP) system-test ## fault-injection run: thousands of jobs, SIGKILL/SIGTERM/SIGSTOP, DB restart; judged by the audit trail (CHAOS_ARGS="--jobs 300 --quick" for a short one)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

dashboards: $(STAMP) ## write the Grafana dashboards (manifests/components/grafana-dashboards) from devtools/dashboards.py
	$(PY) -m devtools.dashboards

pools: $(STAMP) ## render manifests/pools.yaml into the pools' KEDA ScaledJobs (manifests/pools.generated.yaml)
	$(VENV)/bin/jobfence pools render manifests/pools.yaml > manifests/pools.generated.yaml.tmp
	mv manifests/pools.generated.yaml.tmp manifests/pools.generated.yaml

screenshots: $(STAMP) system-test ## run the console's browser test (headless Chromium) and keep its screenshots in docs/console/
	JOBFENCE_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q tests/acceptance/test_console_browser.py

verify: $(STAMP) ## render the manifests and validate them, check migrations give the expected schema, test the wheel
	$(KUBECTL) kustomize manifests/ >/dev/null
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests/manifests tests/integration/test_migrations.py

image: ## build the one image of every function (IMAGE=jobfence:VERSION)
	$(DOCKER) build -t $(IMAGE) .

# The base under a generated overlay that sets NAMESPACE and IMAGE (kustomize needs the
# overlay inside the repository: build/ is ignored by git).
overlay:
	@mkdir -p $(OVERLAY)
	@cp manifests/installation-label.yaml $(OVERLAY)/
	@image='$(IMAGE)'; \
	case "$$image" in \
	  *@*) name="$${image%%@*}"; ref="  digest: $${image#*@}" ;; \
	  *) case "$${image##*/}" in \
	       *:*) name="$${image%:*}"; ref="  newTag: \"$${image##*:}\"" ;; \
	       *) name="$$image"; ref="" ;; \
	     esac ;; \
	esac; \
	{ echo "# Written by make: manifests/ in namespace $(NAMESPACE) with image $$image."; \
	  echo "apiVersion: kustomize.config.k8s.io/v1beta1"; \
	  echo "kind: Kustomization"; \
	  echo "resources: [../../manifests]"; \
	  echo "namespace: $(NAMESPACE)"; \
	  echo "images:"; \
	  echo "  - name: jobfence"; \
	  echo "    newName: $$name"; \
	  if [ -n "$$ref" ]; then echo "  $$ref"; fi; \
	  if [ -n "$(INSTALLATION)" ]; then \
	    echo "# The installation's identity, and the worker pods' label copied from it again."; \
	    echo "patches:"; \
	    echo "  - target: {kind: ConfigMap, name: jobfence-config}"; \
	    echo "    patch: '[{\"op\": \"replace\", \"path\": \"/data/JOBFENCE_INSTALLATION\", \"value\": \"$(INSTALLATION)\"}]'"; \
	    echo "replacements:"; \
	    echo "  - path: installation-label.yaml"; \
	  fi; \
	} > $(OVERLAY)/kustomization.yaml

render: overlay ## print what `make deploy` applies (NAMESPACE=jobfence IMAGE=jobfence:VERSION INSTALLATION=...)
	@$(KUBECTL) kustomize $(OVERLAY)

deploy: overlay ## kubectl apply -k the base into NAMESPACE with IMAGE, then wait for the migration Job
	@$(KUBECTL) -n $(NAMESPACE) get secret jobfence-database >/dev/null || { \
	  echo "Secret jobfence-database (key url) is missing in namespace $(NAMESPACE): see manifests/README.md" >&2; \
	  exit 1; }
	$(KUBECTL) -n $(NAMESPACE) delete job jobfence-migrate --ignore-not-found
	$(KUBECTL) apply -k $(OVERLAY)
	$(KUBECTL) -n $(NAMESPACE) wait --for=condition=complete job/jobfence-migrate --timeout=600s

schema-snapshot: $(STAMP) ## regenerate tests/integration/expected_schema.txt after a migration
	JOBFENCE_UPDATE_SCHEMA_SNAPSHOT=1 $(PY) -m pytest -q tests/integration/test_migrations.py -k expected_schema

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache build *.egg-info

.PHONY: help venv system-test system-demo system-bench postgres-check lint test demo bench chaos pools dashboards verify image overlay render \
	deploy schema-snapshot clean
