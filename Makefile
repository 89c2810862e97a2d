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
# A registry host in the name: a bare jobfence:VERSION means Docker Hub to Kubernetes.
IMAGE ?= localhost/jobfence:$(VERSION)
# The image's base; empty: python:3.11-slim, or the local base where that cannot be pulled.
PYTHON_IMAGE ?=
NAMESPACE ?= jobfence
INSTALLATION ?=
# Optional components of manifests/components to deploy with the base (e.g. "alerts
# console"); the alerts link their runbook entries under RUNBOOK_URL (absolute).
COMPONENTS ?=
RUNBOOK_URL ?=
DOCKER ?= docker
# kubectl: the one built from the pinned sources (build/bin/kubectl, `make kubectl`) unless
# one is named here (KUBECTL=kubectl takes the one on PATH).
KUBECTL ?=
KUBECTL_BIN := $(if $(KUBECTL),$(KUBECTL),$(CURDIR)/build/bin/kubectl)
KUBECTL_DEP := $(if $(KUBECTL),,kubectl)
OVERLAY ?= build/deploy
# Where make cluster-up keeps the local cluster's files.
CLUSTER_DIR ?= build/cluster
# The local cluster's ports on 127.0.0.1 (make cluster-up CLUSTER_API_PORT=...).
export CLUSTER_API_PORT CLUSTER_ETCD_PORT CLUSTER_ETCD_PEER_PORT CLUSTER_PG_PORT
# The network namespace the local cluster makes and runs in (its node: containerd and a
# kubelet running IMAGE).
CLUSTER_NETNS ?= jobfence
export CLUSTER_NETNS

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
system-test system-demo system-cluster system-bench: system-%:
	@devtools/system-packages.sh $*

postgres-check: $(STAMP) system-test ## make sure a PostgreSQL server (and PgBouncer) can be had for the tests
	@if [ -z "$$JOBFENCE_TEST_DATABASE_URL" ]; then \
	  $(PY) -c 'from devtools.embedded_pg import find_bindir; print("PostgreSQL binaries:", find_bindir())'; \
	fi
	@$(PY) -m devtools.pgbouncer

# The control plane from pinned sources (devtools/controlplane/go.mod): built once into
# ~/.cache/jobfence/controlplane (tens of minutes on two cores the first time), linked into
# build/bin. Needs Go only when something is missing from the cache.
controlplane: ## build etcd, kube-apiserver, kube-controller-manager, kubectl, kube-scheduler and the kubelet (once; cached)
	@$(PYTHON) -m devtools.controlplane build

# The OpenTelemetry Collector the traces' tests export to (devtools/otelcol): built once into
# ~/.cache/jobfence/otelcol, linked into build/bin. Needs Go only when it is missing.
otelcol: ## build the OpenTelemetry Collector of the traces' tests (once; cached)
	@$(PYTHON) -m devtools.otelcol build

# The KEDA operator from pinned sources (devtools/keda/go.mod), cached and linked the same
# way: it links every scaler KEDA has, so its first build is the longest (8-18 minutes).
keda: ## build the KEDA operator (once; cached)
	@$(PYTHON) -m devtools.keda build

kubectl: ## build only kubectl (what make deploy and make render use)
	@$(PYTHON) -m devtools.controlplane build kubectl

# The image (IMAGE) and the pause image are imported into the node's containerd.
cluster-up: $(STAMP) controlplane keda system-cluster image-archive ## start a local control plane, the KEDA operator, a node (a kubelet and containerd running IMAGE) and a PostgreSQL (build/cluster)
	@$(PY) -m devtools.cluster up --dir '$(CLUSTER_DIR)' --image-archive build/image/jobfence.tar --image-archive build/image/pause.tar

cluster-shell: ## a shell inside the local cluster's network namespace (kubectl, jobfence and psql reach it)
	@nsenter --net=/var/run/netns/$(CLUSTER_NETNS) -- $${SHELL:-bash}

cluster-down: ## stop the local control plane and remove build/cluster (CLUSTER_DIR)
	@if [ -x $(PY) ]; then $(PY) -m devtools.cluster down --dir '$(CLUSTER_DIR)'; else echo "cluster: nothing to take down"; fi

lint: $(STAMP) ## ruff, mypy and the import-linter contracts (the layers in docs/DEVELOPERS.md)
	$(VENV)/bin/ruff check shared functions devtools tests bench demo examples
	@$(PY) -m devtools.linktree >/dev/null  # jobfence as installed, for mypy and lint-imports
	$(VENV)/bin/mypy
	PYTHONPATH=build/src $(VENV)/bin/lint-imports

# The tests that stop their session's kubelet run in a session of their own — its own
# cluster, in its own network namespace and cgroup root — beside the others' session (mostly
# waiting for the node to be judged lost); its output is shown when both are done.
test: lint postgres-check controlplane otelcol keda image image-archive ## lint, type-check, and run every test on a real PostgreSQL and a real Kubernetes cluster (a kubelet and containerd running the image)
	@node_log=$$(mktemp); \
	JOBFENCE_TEST_IMAGE_ARCHIVES=as-written $(PY) -m pytest -m stops_node $(PYTEST_ARGS) >"$$node_log" 2>&1 & node=$$!; \
	JOBFENCE_TEST_IMAGE_ARCHIVES=as-written $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m 'not stops_node and not model_search' $(PYTEST_ARGS); main=$$?; \
	wait $$node; nodes=$$?; \
	echo "== the session that stops its kubelet (pytest -m stops_node):"; cat "$$node_log"; rm -f "$$node_log"; \
	[ $$main -eq 0 ] && [ $$nodes -eq 0 ]

demo: $(STAMP) system-demo ## run the main story end to end on embedded defaults
	$(PY) -m demo.run

demo-cluster: $(STAMP) controlplane keda system-cluster image-archive ## the story on the real control plane and KEDA operator (root; DEMO_ARGS=--keep leaves the cluster up)
	$(PY) -m demo.cluster $(DEMO_ARGS)

# The benchmarks' own virtualenv: jobfence plus the peers it is measured against.
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[test]" -r bench/requirements.txt
	@touch $@

bench: $(BENCH_STAMP) system-bench controlplane keda ## run the benchmarks beside pgbench and the peers, write docs/BENCHMARKS.md (BENCH_ARGS="--quick" for a smoke run)
	$(BENCH_VENV)/bin/python -m bench.run $(BENCH_ARGS)

chaos: $(STAMP) system-test ## fault-injection run: thousands of jobs, SIGKILL/SIGTERM/SIGSTOP, DB restart; judged by the audit trail (CHAOS_ARGS="--jobs 300 --quick" for a short one)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

# The job-life model's stateful test (tests/integration/test_job_life.py) at thousands of
# sequences from a fresh seed (MODEL_SEED=N reproduces a run), and its search for a broken rule;
# make test runs 20 sequences from a fixed one and judges the sequence the search finds.
MODEL_EXAMPLES ?= 2000
MODEL_SEED ?=
model-check: $(STAMP) system-test ## the stateful test of a job's life against its model, at thousands of sequences (MODEL_EXAMPLES, MODEL_SEED)
	JOBFENCE_MODEL_EXAMPLES=$(MODEL_EXAMPLES) JOBFENCE_MODEL_SEED=$(MODEL_SEED) JOBFENCE_MODEL_TIMEOUT=0 \
	  $(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 \
	  tests/integration/test_job_life.py::test_every_sequence_of_verbs_agrees_with_the_model \
	  tests/integration/test_job_life.py::test_a_broken_rule_is_found

chaos-guards: $(STAMP) system-test ## a worker's guards under fire: 1,000 killed heartbeat connections, 1,000 hostile process names (GUARD_CHAOS_ARGS="--jobs 50 --kills 50" for a short one)
	$(PY) -m bench.guard_chaos $(GUARD_CHAOS_ARGS)

chaos-failover: $(STAMP) system-test controlplane ## failover run on a real Patroni cluster (etcd, three members, synchronous standby): thousands of jobs, node losses, switchovers, frozen primaries; judged by evidence kept outside the database (FAILOVER_ARGS="--jobs 300 --faults 3")
	$(PY) -m bench.chaos_failover $(FAILOVER_ARGS)

dashboards: $(STAMP) ## write the Grafana dashboards (manifests/components/grafana-dashboards) from devtools/dashboards.py
	$(PY) -m devtools.dashboards

pools: $(STAMP) ## render manifests/pools.yaml into the pools' KEDA ScaledJobs (manifests/pools.generated.yaml)
	$(VENV)/bin/jobfence pools render manifests/pools.yaml > manifests/pools.generated.yaml.tmp
	mv manifests/pools.generated.yaml.tmp manifests/pools.generated.yaml

screenshots: $(STAMP) system-test ## run the console's browser test (headless Chromium) and keep its screenshots in docs/console/
	JOBFENCE_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q tests/acceptance/test_console_browser.py

verify: $(STAMP) controlplane ## render the manifests and validate them (also on a real API server), check migrations give the expected schema, test the wheel
	$(KUBECTL_BIN) kustomize manifests/ >/dev/null
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests/manifests tests/integration/test_migrations.py

# The one image: `docker build` where a Docker daemon answers, else buildah with runc (as
# root, installed from Debian's packages), on the local base where python:3.11-slim cannot be
# pulled; skipped when an image of the same inputs is there (devtools/image.py).
image: ## build the one image of every function and print its name, size and digest (IMAGE=localhost/jobfence:VERSION PYTHON_IMAGE=...)
	@DOCKER='$(DOCKER)' $(PYTHON) -m devtools.image build --image '$(IMAGE)' $(if $(PYTHON_IMAGE),--python-image '$(PYTHON_IMAGE)')

base-image: ## build the local Python base localhost/jobfence-python:3.11 (Debian bookworm, root; once, cached by its recipe)
	@$(PYTHON) -m devtools.image base

image-archive: ## the image and the local node's pause image as docker-archive files in build/image (for `ctr images import`)
	@DOCKER='$(DOCKER)' $(PYTHON) -m devtools.image archive --image '$(IMAGE)' $(if $(PYTHON_IMAGE),--python-image '$(PYTHON_IMAGE)')

# The base under a generated overlay (build/deploy: kustomize needs it inside the
# repository, and build/ is ignored by git) that sets NAMESPACE, IMAGE, INSTALLATION and
# adds COMPONENTS.
overlay: $(STAMP)
	@$(PY) -m devtools.deploy overlay --dir '$(OVERLAY)' --namespace '$(NAMESPACE)' \
	  --image '$(IMAGE)' --installation '$(INSTALLATION)' --component '$(COMPONENTS)' \
	  --runbook-url '$(RUNBOOK_URL)'

render: overlay $(KUBECTL_DEP) ## print what `make deploy` applies (NAMESPACE=jobfence IMAGE=localhost/jobfence:VERSION INSTALLATION=... COMPONENTS=...)
	@$(KUBECTL_BIN) kustomize $(OVERLAY)

deploy: overlay $(KUBECTL_DEP) ## check the Secrets and CRDs it needs, apply the base server-side into NAMESPACE with IMAGE, wait for the migration Job (KUBECONFIG=build/cluster/kubeconfig for the local cluster)
	@$(PY) -m devtools.deploy apply --dir '$(OVERLAY)' --kubectl '$(KUBECTL_BIN)'

schema-snapshot: $(STAMP) ## regenerate tests/integration/expected_schema.txt after a migration
	JOBFENCE_UPDATE_SCHEMA_SNAPSHOT=1 $(PY) -m pytest -q tests/integration/test_migrations.py -k expected_schema

clean: cluster-down ## stop the local cluster, remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache build *.egg-info

.PHONY: help venv system-test system-demo system-cluster system-bench cluster-shell postgres-check controlplane otelcol keda kubectl model-check \
	cluster-up cluster-down lint test demo demo-cluster bench chaos chaos-guards chaos-failover pools dashboards verify image overlay \
	render deploy \
	schema-snapshot clean
