# Every target sets up what it needs on a fresh machine: the virtualenv in .venv, the Python
# packages, and the binaries the clusters run (built once into ~/.cache/trainjob-dispatcher).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WORKERS ?= 2
# pytest-xdist processes `make test` runs the tests in: each has clusters of its own, and
# about half of a serial run's time is spent waiting on timeouts and controllers, not CPU.
TEST_PROCESSES ?= 2
PYTEST_ARGS ?=

.PHONY: help release venv binaries browser lint test test-images conformance demo demo-down clusters-up clusters-down clusters-status clean engine engine-stop images compose-up compose-down

help:
	@echo "make test           lint, then run the test suite against real local control planes (TEST_PROCESSES=2 pytest processes)"
	@echo "make lint           ruff over the tree (its rules in pyproject.toml); make test runs it first"
	@echo "make demo           run dispatcher + operators on a local manager and 2 workers with sample jobs"
	@echo "make demo-down      stop the demo clusters and remove their state"
	@echo "make binaries       build or find every binary the clusters run (control plane, JobSet, kwok, Trainer, Kueue, controller-gen)"
	@echo "make browser        install Chromium and chromedriver (Debian packages) for the dashboard test"
	@echo "make clusters-up / clusters-status / clusters-down"
	@echo "make engine         find a Docker engine, or install (Debian's docker.io) and start the project's own"
	@echo "make images         build every container image here, from sources (bases, project, control plane, workload)"
	@echo "make compose-up     the whole product on Docker (docker compose up --build); compose-down removes it"
	@echo "make engine-stop    stop the project's own Docker engine (never another)"
	@echo "make conformance    compare this operator's JobSets and status with upstream Trainer's controller"
	@echo "make release VERSION=x.y.z REGISTRY=registry.example.com/team"
	@echo "                    write dist/<base>.yaml for each installable base, images set"
	@echo "make bench          benchmark the dispatcher (over an hour on 2 cores); figures in bench-results/"
	@echo "make bench-quick    the same benchmark at small scale (a few minutes)"
	@echo "make bench-smoke    the benchmark at a tiny scale (its scenarios, the comparison, a failing start), as tests"
	@echo "make bench-scale    the dispatcher on 2 workers of 1,000 Nodes and 20,000 Pods each; figures in bench-results/scale/"
	@echo "make test-scale     the tests on a worker of 1,000 Nodes and 20,000 Pods (a lost watch during churn), about five minutes"
	@echo "make test-kind-remote-view  only the remote view deployed on kind (its own kind clusters; also in make test), about ten minutes"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# One file per installable base under dist/, images set to $(REGISTRY)/<name>:$(VERSION);
# WORKER_SECRETS="a-kubeconfig b-kubeconfig" replaces the sample worker Secret list.
release: venv
	@test -n "$(VERSION)" -a -n "$(REGISTRY)" || { echo "usage: make release VERSION=x.y.z REGISTRY=registry.example.com/team [WORKER_SECRETS=...]" >&2; exit 2; }
	$(PY) -m clusters provision --only kubectl
	$(PY) -m clusters release --version $(VERSION) --registry $(REGISTRY) $(foreach s,$(WORKER_SECRETS),--worker-secret $(s))

binaries: venv
	$(PY) -m clusters provision

# The dashboard test drives a real headless Chromium through chromedriver.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "chromium and chromedriver are needed for the dashboard test: install them (Debian/Ubuntu: apt-get install chromium chromium-driver)" >&2; exit 1; fi; \
	sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
	echo "installing chromium and chromium-driver with apt-get"; \
	$$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
		|| { echo "could not install chromium and chromium-driver; install them and run make test again" >&2; exit 1; }

# The images the tests run (the project's, the control plane's, JobSet's, the workload and
# kind's node image), in the foreground, printing a cold build's progress as it goes; what
# exists is kept (the project's own images are rebuilt from the working tree, seconds when
# unchanged). The engine `make engine` started keeps running afterwards (`make engine-stop`).
test-images: images
	$(PY) -m clusters.kind_node

# Ruff, with the rules in pyproject.toml; a finding fails `make test` before any cluster starts.
lint: venv
	$(VENV)/bin/ruff check .

# The images the container and kind modules need are built in the background while the other
# modules run (clusters/prebuild.py; its log: ~/.cache/trainjob-dispatcher/prebuild.log).
test: lint binaries browser
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

engine: venv
	$(PY) -m clusters engine start

engine-stop: venv
	$(PY) -m clusters engine stop

images: binaries engine
	$(PY) -m clusters images

# DOCKER_HOST names the engine `make engine` found or started.
compose-up: images
	DOCKER_HOST=$$($(PY) -m clusters engine env | sed 's/^export DOCKER_HOST=//') docker compose up --build --detach
	@echo "manager kubeconfig: docker compose cp certs:/pki/manager/admin-host.kubeconfig manager.kubeconfig"

compose-down: venv
	DOCKER_HOST=$$($(PY) -m clusters engine env | sed 's/^export DOCKER_HOST=//') docker compose down --volumes

clusters-up: binaries
	$(PY) -m clusters up --workers $(WORKERS)

clusters-status: venv
	$(PY) -m clusters status

clusters-down: venv
	$(PY) -m clusters down

conformance: binaries
	$(PY) -m clusters conformance

demo: binaries
	$(PY) -m clusters demo

demo-down: clusters-down

.PHONY: bench bench-quick bench-smoke bench-scale test-scale test-kind-remote-view
bench: binaries
	$(PY) -m bench --output bench-results

bench-quick: binaries
	$(PY) -m bench --quick --output bench-results/quick

bench-scale: binaries
	$(PY) -m bench --suite scale --output bench-results/scale

# The comparison with Kueue MultiKueue at a tiny scale, as a test (not part of `make test`).
bench-smoke: binaries
	$(PY) -m pytest -m bench_compare tests/bench

# The tests at the size of real clusters (not part of `make test`).
test-scale: binaries
	$(PY) -m pytest -m scale tests

# The remote view's kind module alone, on kind clusters of its own (make test runs it too).
test-kind-remote-view: binaries test-images
	$(PY) -m pytest -m kind_remote_view tests/kind

clean: clusters-down
	rm -rf $(VENV) *.egg-info
