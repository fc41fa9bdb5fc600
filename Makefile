# gpuops: every target builds and uses its own virtualenv, so a fresh clone needs only
# python3 (>= 3.11) and Go (>= 1.26, for the first build of the test control plane).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The real GPU Operator CRDs installed into the test API server.
GPU_OPERATOR_CRDS_DEFAULT := $(abspath ../shared/reference/gpu-operator/v26.7.0)
export GPUOPS_GPU_OPERATOR_CRDS ?= $(if $(wildcard $(GPU_OPERATOR_CRDS_DEFAULT)),$(GPU_OPERATOR_CRDS_DEFAULT),)
FLEET ?= demo

.PHONY: venv demo test bench testenv-build testenv-up testenv-down clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

testenv-build: venv
	$(PY) -m testenv build

demo: testenv-build
	$(PY) -m testenv demo --fleet $(FLEET)

test: testenv-build
	$(PY) -m pytest

bench: testenv-build
	$(PY) -m pytest tests/bench -p no:cacheprovider -o addopts= -q -s

testenv-up: testenv-build
	$(PY) -m testenv up --fleet $(FLEET)

testenv-down: venv
	$(PY) -m testenv down

clean:
	-$(PY) -m testenv down
	rm -rf $(VENV) .gpuops .pytest_cache
