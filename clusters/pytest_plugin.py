"""pytest fixtures for tests that need real clusters.

Enable with ``pytest_plugins = ["clusters.pytest_plugin"]`` in a conftest.

* ``multicluster`` (session): a manager and ``CLUSTERS_TEST_WORKERS`` workers (default 2),
  started in the session's temporary directory and stopped at the end of the session on
  every exit path: normal end, failures, Ctrl-C (fixture teardown) and a killed pytest (the
  processes are tied to it with PDEATHSIG). Set ``CLUSTERS_TEST_STATE_DIR`` to reuse clusters
  already started with ``python -m clusters up --state-dir DIR``; those are left running
  (one pytest process only: under pytest-xdist each process needs clusters of its own).
* ``namespace`` (function): a fresh namespace of the same name in every cluster, deleted
  afterwards.
* ``upstream_crds_worker`` (function): the last worker, serving upstream Kubeflow Trainer's
  TrainJob and runtime CRDs (read from the Trainer module) for the test; it serves the
  CRDs it had before again afterwards.
* ``kueue_multicluster`` (module): a second, separate manager and two workers that each run
  Kueue (``clusters.kueue``); the manager serves Kueue's CRDs instead of the project's
  MultiKueue ones. Started when a test first asks for it and shared by the modules that
  follow; stopped as soon as the next test of another module does not ask for it (or none
  is left), so the tests that run after them do not share the machine with three idle
  apiservers and their Kueues. A later module that asks again gets new ones. Its
  manager's Kueue waits for an external dispatcher named ``KUEUE_TEST_DISPATCHER``;
  ``harness.use_kueue_dispatcher`` restarts it with another. Every one of them runs Kueue
  with the integrations a MultiKueue team typically enables (``KUEUE_TEST_INTEGRATIONS``:
  batch Jobs, JobSets and TrainJobs), since the dispatcherName holds for every kind.
* ``docker_engine`` (session): a Docker engine that answers (``clusters.engine``): the one
  found, or the project's own, installed and started, and stopped at the end of the session
  only if this session started it (under pytest-xdist it is left running: `make engine-stop`).
* ``project_images`` (session): every image ``python -m clusters images`` builds, built on
  that engine (the project's own from the working tree); a mapping of name to what was done.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client

from clusters import crds, kueue
from clusters.controlplane import ControlPlane
from clusters.local import ClusterInfo, LocalClusters
from clusters.nodes import NodeLayout
from controller_kit.kubeclient import api_client


@dataclass
class Cluster:
    """One cluster as a test sees it: its name, kubeconfig and ready API clients."""

    name: str
    role: str
    kubeconfig: Path
    control_plane: ControlPlane
    api: client.ApiClient = field(repr=False)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def reachable(self) -> bool:
        return self.control_plane.apiserver_ready()


@dataclass
class MultiCluster:
    harness: LocalClusters
    clusters: dict[str, Cluster]

    @property
    def manager(self) -> Cluster:
        return self.clusters["manager"]

    @property
    def workers(self) -> list[Cluster]:
        return [c for c in self.clusters.values() if c.role == "worker"]

    def __getitem__(self, name: str) -> Cluster:
        return self.clusters[name]

    def __iter__(self):
        return iter(self.clusters.values())

    def stop(self, name: str) -> ClusterInfo:
        return self.harness.stop(name)

    def start(self, name: str, timeout: float = 60) -> ClusterInfo:
        return self.harness.start(name, timeout=timeout)


def _connect(harness: LocalClusters) -> MultiCluster:
    state = harness.load()
    clusters = {}
    for record in state.clusters:
        clusters[record.name] = Cluster(
            name=record.name,
            role=record.role,
            kubeconfig=harness.kubeconfig(record.name),
            control_plane=harness.control_plane(record),
            api=api_client(harness.kubeconfig(record.name)),
        )
    return MultiCluster(harness, clusters)


@pytest.fixture(scope="session")
def multicluster(tmp_path_factory, pytestconfig) -> MultiCluster:
    reuse = os.environ.get("CLUSTERS_TEST_STATE_DIR")
    if reuse:
        if _xdist_workers(pytestconfig) > 1:
            # Two processes' module fixtures would register workers and add Nodes of the
            # same names on the same clusters.
            pytest.fail(f"CLUSTERS_TEST_STATE_DIR={reuse} is for one pytest process: run "
                        "plain pytest, or make test with TEST_PROCESSES=0")
        harness = LocalClusters(reuse)
        not_running = [i.name for i in harness.status() if i.state != "running"]
        if not harness.load().clusters or not_running:
            pytest.fail(
                f"CLUSTERS_TEST_STATE_DIR={reuse}: clusters not running ({not_running or 'none'}); "
                f"run `python -m clusters up --state-dir {reuse}` first"
            )
        yield _connect(harness)
        return
    workers = int(os.environ.get("CLUSTERS_TEST_WORKERS", "2"))
    yield from _session_clusters(tmp_path_factory.mktemp("clusters"), workers=workers)


# The dispatcherName the Kueue clusters' manager starts with: Kueue waits for a
# dispatcher of that name (``python -m dispatcher run --mode kueue``) to nominate workers.
KUEUE_TEST_DISPATCHER = "trainjob-dispatcher.io/capacity"


# The job kinds their Kueue manages: Kueue's dispatcherName is cluster-wide, so the tests
# run with what a MultiKueue team enables, not TrainJobs alone.
KUEUE_TEST_INTEGRATIONS = kueue.MULTIKUEUE_TEAM_INTEGRATIONS


class OnDemand:
    """What a fixture starts when a test first asks for it (``get``) and stops once the
    next test, in another module, does not ask for it (``on_demand``): clusters only a few
    modules need, which would otherwise idle on the machine until the session ends. A later
    module that asks again gets new ones."""

    def __init__(self, fixture: str, start: Callable[[], Iterator]) -> None:
        self.fixture = fixture  # the name the tests ask for
        self._start = start  # a generator function: yields the value, cleans up after
        self._running: Iterator | None = None
        self._value = None

    def get(self):
        if self._running is None:
            running = self._start()
            self._value = next(running)
            self._running = running
        return self._value

    def stop(self) -> None:
        running, self._running, self._value = self._running, None, None
        if running is not None:
            running.close()  # the generator's ``finally``

    def done_with(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        """Whether ``item`` is the last test of a run of modules asking for it: a module's
        tests share its module fixtures, whichever of them ask."""
        return self.fixture in getattr(item, "fixturenames", ()) and (
            nextitem is None or (_module(nextitem) != _module(item)
                                 and self.fixture not in nextitem.fixturenames))


_ON_DEMAND = pytest.StashKey[list[OnDemand]]()


def on_demand(config: pytest.Config, fixture: str, start: Callable[[], Iterator]) -> OnDemand:
    """An ``OnDemand`` for module fixture ``fixture``, stopped by this plugin after the
    last test of a run of modules asking for it (and by the caller at the session's end)."""
    made = OnDemand(fixture, start)
    config.stash.setdefault(_ON_DEMAND, []).append(made)
    return made


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's fixtures of every scope that ends with it are finalized (so the
    module fixtures using them have let go): stop what no test next asks for."""
    result = yield
    for made in item.config.stash.get(_ON_DEMAND, []):
        if made.done_with(item, nextitem):
            made.stop()
    return result


KUEUE_FIXTURE = "kueue_multicluster"


@pytest.fixture(scope="session")
def _kueue_clusters(tmp_path_factory, pytestconfig):
    names = ("manager", "worker-1", "worker-2")
    clusters = on_demand(pytestconfig, KUEUE_FIXTURE, lambda: _session_clusters(
        tmp_path_factory.mktemp("kueue-clusters"), workers=2, kueue_clusters=names,
        kueue_dispatcher=KUEUE_TEST_DISPATCHER, kueue_integrations=KUEUE_TEST_INTEGRATIONS,
        timeout=300))
    yield clusters
    clusters.stop()


@pytest.fixture(scope="module")
def kueue_multicluster(_kueue_clusters) -> MultiCluster:
    return _kueue_clusters.get()


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist processes share this session (0: not under xdist). Read from
    the session's own config: a pytest started by a test inherits xdist's environment
    variables without being one of its workers."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workercount"]) if workerinput else 0


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that selected the container or kind modules has their images built in the
    background from now on, while the other modules run (``clusters.prebuild``)."""
    from clusters import prebuild

    prebuild.start_if_selected(item.nodeid for item in session.items)


@pytest.fixture(scope="session")
def docker_engine(pytestconfig):
    from clusters import engine, prebuild

    # The background build installs and starts the engine too: waited for first, so that
    # nothing is built twice at once.
    prebuild.wait()
    found = engine.ensure_engine()
    yield found
    # Under pytest-xdist another process may still use the engine this one started.
    if found.started_here and not _xdist_workers(pytestconfig):
        engine.stop_engine()


@pytest.fixture(scope="session")
def project_images(docker_engine) -> dict[str, str]:
    from clusters import images

    return images.build_images(docker_engine)


def _session_clusters(state_dir: Path, timeout: float = 180, **up_args):
    """Clusters for the test session, stopped at its end on every exit path."""
    harness = LocalClusters(state_dir, tied_to_caller=True)
    multi = None
    try:
        # No default Nodes: each test adds the kwok Nodes it needs, so capacity is its own.
        harness.up(timeout=timeout, node_layout=NodeLayout(default=[]), **up_args)
        multi = _connect(harness)
        yield multi
    finally:
        for cluster in multi or ():
            cluster.api.close()
        harness.down()


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(multicluster: MultiCluster, request) -> str:
    name = _namespace_name(request.node.name)
    for cluster in multicluster:
        cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    for cluster in multicluster:
        try:
            cluster.core.delete_namespace(name)
        except Exception:  # noqa: BLE001 - cleanup must not mask the test result
            # A test may leave a cluster stopped; its namespace goes with `down`.
            pass


@pytest.fixture
def upstream_crds_worker(multicluster: MultiCluster) -> Cluster:
    worker = multicluster.workers[-1]
    before = multicluster.harness.use_trainer_crds(worker.name, crds.UPSTREAM)
    yield worker
    multicluster.harness.use_trainer_crds(worker.name, before)
