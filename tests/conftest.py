"""Fixtures shared by every test directory: the harness's clusters (plugin) and the
project's commands run as real processes against them."""

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
