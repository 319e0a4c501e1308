"""Fixtures shared by every test directory: the harness's clusters (plugin) and the
project's commands run as real processes against them; how `make test` shares the tests
between its pytest-xdist workers."""

import pytest

from clusters.testing import ServiceProcess

pytest_plugins = ["clusters.pytest_plugin", "clusters.test_timeline", "clusters.failure_log"]


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


# Directories whose modules run together, in name order, on one pytest-xdist worker: the
# kind tests share one set of kind clusters, deploy the product first and end with `down`
# (tests/kind/conftest.py); the container tests share one build of the images.
SHARED = ("tests/kind/", "tests/containers/")
# Handed out first: the longest, so the other worker's short modules fill in beside it
# rather than it running alone at the end.
FIRST = "tests/kind/"


# The modules that use the Kueue clusters (``kueue_multicluster``): one unit, so that one
# process starts those clusters once, and stops them after the unit's last test (the plugin
# stops them when the next test does not ask for them).
KUEUE_UNIT = ("tests/dispatcher/test_kueue.py", "tests/dispatcher/test_kueue_kinds.py",
              "tests/harness/test_kueue_harness.py")


def _scope(nodeid: str) -> str:
    """The unit of work a worker takes whole: a module, one of the ``SHARED`` directories,
    or the ``KUEUE_UNIT``."""
    path = nodeid.split("::", 1)[0]
    if path in KUEUE_UNIT:
        return "the Kueue clusters' modules"
    return next((shared for shared in SHARED if path.startswith(shared)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadscope`` (`make test`): each module runs whole on one worker, so
    its module fixtures (a dispatcher, registered workers, Nodes) start once and its tests
    run in file order, as in a serial run; each worker has clusters of its own (the session
    fixtures). Another ``--dist`` keeps xdist's own scheduler."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ByModule(config, log)


# pytest-timeout's limit for a test of the ``SHARED`` directories, instead of the 600 s of
# pyproject.toml. Their first test carries the set-up of what the directory shares (kind's
# clusters and the product deployed on them, the compose stack), whose waits stretch with
# the machine's load (``clusters.machine_load``, up to 8 times), and on a new machine it
# waits for the images the background build is still making: a loaded cold run took more
# than 600 s there without anything hanging. The limit only catches a hang.
SHARED_TIMEOUT = 1800


def pytest_collection_modifyitems(config, items):
    """``FIRST`` ahead of the rest, each keeping its order (`make test` passes
    ``--no-loadscope-reorder`` so that the scheduler hands the units out in this order);
    the ``SHARED`` directories' tests get ``SHARED_TIMEOUT`` unless they name their own."""
    # Imported here: importing the plugin before pytest registers it (pytest_plugins
    # above) would keep pytest from rewriting its asserts.
    from clusters.pytest_plugin import KUEUE_FIXTURE

    items.sort(key=lambda item: 0 if item.nodeid.startswith(FIRST) else 1)
    strays = sorted({item.nodeid.split("::", 1)[0] for item in items
                     if KUEUE_FIXTURE in item.fixturenames} - set(KUEUE_UNIT))
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)}: asks for {KUEUE_FIXTURE} but is not "
                                "in tests/conftest.py's KUEUE_UNIT; add it there, so that "
                                "one process runs every module that uses those clusters")
    for item in items:
        if _scope(item.nodeid) in SHARED and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SHARED_TIMEOUT))
