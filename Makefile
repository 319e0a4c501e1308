# Every target sets up what it needs on a fresh machine: the virtualenv in .venv, the Python
# packages, and the control-plane binaries (built once into ~/.cache/trainjob-dispatcher).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WORKERS ?= 2
PYTEST_ARGS ?=

.PHONY: help venv binaries test demo demo-down clusters-up clusters-down clusters-status clean

help:
	@echo "make test           run the test suite against real local control planes"
	@echo "make demo           run dispatcher + operators on a local manager and 2 workers with sample jobs"
	@echo "make demo-down      stop the demo clusters and remove their state"
	@echo "make binaries       build or find etcd, kube-apiserver, kube-controller-manager"
	@echo "make clusters-up / clusters-status / clusters-down"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

binaries: venv
	$(PY) -m clusters provision

test: binaries
	$(PY) -m pytest $(PYTEST_ARGS)

clusters-up: binaries
	$(PY) -m clusters up --workers $(WORKERS)

clusters-status: venv
	$(PY) -m clusters status

clusters-down: venv
	$(PY) -m clusters down

demo: binaries
	$(PY) -m clusters demo

demo-down: clusters-down

clean: clusters-down
	rm -rf $(VENV) *.egg-info
