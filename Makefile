# gpuops: every target builds and uses its own virtualenv, so a fresh clone needs only
# python3 (>= 3.11) and Go (>= 1.26, for the first build of the test control plane), and for
# `make test` PostgreSQL's server (Debian's postgresql package; installed here when missing
# and we may: root with apt-get).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The real GPU Operator CRDs installed into the test API server.
GPU_OPERATOR_CRDS_DEFAULT := $(abspath ../shared/reference/gpu-operator/v26.7.0)
export GPUOPS_GPU_OPERATOR_CRDS ?= $(if $(wildcard $(GPU_OPERATOR_CRDS_DEFAULT)),$(GPU_OPERATOR_CRDS_DEFAULT),)
FLEET ?= demo
# Who the console acts as (the demo configuration defines U0ALICE operator, U0BOB and
# U0CAROL approvers, U0DAVE viewer, U0ERIN admin).
DEMO_USER ?= U0ALICE
# Parallel pytest workers for `make check` and `make test` (pytest-xdist; most tests wait on
# a socket, a clock or a control plane rather than compute, so four suit two cores; 0 runs
# in one process).
TEST_WORKERS ?= 4
# The bot acts as its own ServiceAccount with its least-privilege RBAC (deploy/rbac.yaml,
# granted by the testenv; the "bot" context), never as the cluster's admin.
DEMO_ARGS := --config deploy/config.example.yaml --kubeconfig .gpuops/testenv/kubeconfig --context bot \
	--database .gpuops/demo.db

.PHONY: docs check fuzz reliability venv demo test postgres-server bench bench-scaling mutation testenv-build testenv-up testenv-down clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

testenv-build: venv
	$(PY) -m testenv build

# The control plane with the demo fleet, then the bot: in Socket Mode when Slack tokens
# are set, else the console (which reads a script from stdin when it is not a terminal).
demo: testenv-build
	$(PY) -m testenv demo --fleet $(FLEET)
	@if [ -n "$$SLACK_BOT_TOKEN$$SLACK_BOT_TOKEN_FILE" ] && [ -n "$$SLACK_APP_TOKEN$$SLACK_APP_TOKEN_FILE" ]; then \
		echo "gpuops: Slack tokens found; running the bot in Socket Mode (Ctrl-C stops it)"; \
		$(VENV)/bin/gpuops run $(DEMO_ARGS); \
	else \
		echo "gpuops: no Slack tokens; the console as $(DEMO_USER) (make demo DEMO_USER=U0BOB to be someone else)"; \
		$(VENV)/bin/gpuops console --as $(DEMO_USER) $(DEMO_ARGS); \
	fi

# The fast loop, for every change: lint, the import contracts, the type checker (mypy) and
# every test that needs neither the control plane nor a build: the folders that hold only
# those (tests/README.md; no Go needed; about 2 minutes on 2 cores). `make test` runs all of
# it too, with the control-plane suites and the packaging tests (the image, the chart's helm
# tests).
check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest tests/unit tests/e2e tests/testenv tests/reliability/inprocess \
		-n $(TEST_WORKERS) --dist loadgroup -q -p no:cacheprovider --durations=10

# Everything, on TEST_WORKERS parallel workers (a worker starts its own control plane when
# it first needs one). The slowest 25 tests and the
# time per suite are printed at the end (CI's log shows them).
test: testenv-build postgres-server
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

# The storage tests on PostgreSQL start a real server from Debian's package (testenv/postgres.py).
postgres-server:
	@if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "gpuops: installing Debian's postgresql package for the storage tests on PostgreSQL"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
		else \
			echo "gpuops: make test needs PostgreSQL's server: sudo apt-get install postgresql" >&2; exit 1; \
		fi; \
	fi

# The documentation site (mkdocs.yml, docs/), into site/; the references are generated from the
# code as it builds (docs/hooks.py). --strict: a broken link or a missing page fails it.
docs: venv
	$(VENV)/bin/mkdocs build --strict

bench: testenv-build postgres-server
	$(PY) -m pytest tests/bench --ignore=tests/bench/test_scaling_curve.py -p no:cacheprovider -o addopts= -q -s

# The read path's scaling curve: about 30 minutes and up to ~20 GB; GPUOPS_SCALING_SIZES,
# GPUOPS_SCALING_CLUSTERS and GPUOPS_SCALING_REPEAT make it smaller.
bench-scaling: testenv-build
	$(PY) -m pytest tests/bench/test_scaling_curve.py -p no:cacheprovider -o addopts= -q -s

# Fuzzing (hypothesis, 10,000 cases a target, seeded; not part of `make test`, which runs a
# few hundred): the figures go to tests/reliability/results/fuzz.json. FUZZ_SEED=n to vary.
FUZZ_SEED ?= 20261204
fuzz: venv
	GPUOPS_FUZZ_EXAMPLES=10000 GPUOPS_FUZZ_SEED=$(FUZZ_SEED) GPUOPS_FUZZ_RESULTS=tests/reliability/results/fuzz.json \
		$(PY) -m pytest tests/e2e/test_fuzz.py -p no:cacheprovider -p no:randomly -o addopts= -q -s

# Reliability figures (tests/reliability/, the issue's counts; `make test` runs each suite
# small): written to tests/reliability/results/, one entry a seed. SEED=n to vary, SUITE=kills
# (a pytest -k expression) for one suite.
SEED ?= 20261204
reliability: testenv-build
	GPUOPS_RELIABILITY_FULL=1 GPUOPS_RELIABILITY_RESULTS=1 GPUOPS_RELIABILITY_SEED=$(SEED) \
		$(PY) -m pytest tests/reliability -p no:cacheprovider -p no:randomly -o addopts= -q -s $(if $(SUITE),-k '$(SUITE)')

# Mutation testing of the safety modules (slow: four to five hours on 2 cores for all; not
# part of `make test`). MODULES=freezes,capacity runs those; each module's results go to its
# own file in tests/mutation/results/, stamped with the commit (a clean tree only).
mutation: venv
	$(PY) -m tests.mutation.run $(if $(MODULES),--modules $(MODULES)) $(if $(MUTATION_CHILDREN),--children $(MUTATION_CHILDREN)) $(if $(MUTATION_TOOL),--tool $(MUTATION_TOOL))

testenv-up: testenv-build
	$(PY) -m testenv up --fleet $(FLEET)

testenv-down: venv
	$(PY) -m testenv down

clean:
	-$(PY) -m testenv down
	rm -rf $(VENV) .gpuops .pytest_cache .mypy_cache site
