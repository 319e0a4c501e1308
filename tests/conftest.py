"""Fixtures shared by every test directory: the harness's clusters (plugin) and the
project's commands run as real processes against them; how `make test` shares the tests
between its pytest-xdist workers."""

from pathlib import Path

import pytest

from clusters.testing import ServiceProcess

pytest_plugins = ["clusters.pytest_plugin"]


def _process_fixture(module: str, tmp_path):
    started: list[ServiceProcess] = []

    def start(cluster, *extra_args: str) -> ServiceProcess:
        process = ServiceProcess(module, cluster.kubeconfig,
                                 tmp_path / f"{module}-{cluster.name}-{len(started)}.log",
                                 extra_args)
        started.append(process)
        return process.start()

    return started, start


@pytest.fixture
def run_operator(tmp_path):
    """``run_operator(cluster, *args)``: the training operator against ``cluster``."""
    started, start = _process_fixture("training_operator", tmp_path)
    yield start
    for process in started:
        process.stop()


@pytest.fixture
def run_dispatcher(tmp_path):
    """``run_dispatcher(manager, *args)``: the dispatcher against the manager cluster."""
    started, start = _process_fixture("dispatcher", tmp_path)
    yield start
    for process in started:
        process.stop()


# Directories whose modules run together, in name order, on one xdist worker: the kind tests
# share one set of kind clusters, deploy the product first and end with `down`
# (tests/kind/conftest.py); the container tests share one build of the images.
SHARED_GROUPS = {"kind": "kind", "containers": "containers"}
# Groups handed out first: the longest, so the other worker's short ones fill in beside them
# rather than one long group running alone at the end.
FIRST = ("kind",)


def _group(item: pytest.Item) -> str:
    path = Path(str(item.fspath)).relative_to(Path(__file__).parent)
    return SHARED_GROUPS.get(path.parts[0], str(path))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` each module runs whole on one xdist worker, so its module
    fixtures (a dispatcher, registered workers, Nodes) start once and its tests run in file
    order, as in a serial run. Each worker has clusters of its own (the session fixtures)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=lambda item: 0 if _group(item) in FIRST else 1)
