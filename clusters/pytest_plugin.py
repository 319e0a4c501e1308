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
* ``kueue_multicluster`` (session): a second, separate manager and two workers that each run
  Kueue (``clusters.kueue``); the manager serves Kueue's CRDs instead of the project's
  MultiKueue ones. Started only when a test asks for it, so the other tests do not pay for
  it. Its manager's Kueue waits for an external dispatcher named ``KUEUE_TEST_DISPATCHER``;
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


@pytest.fixture(scope="session")
def kueue_multicluster(tmp_path_factory) -> MultiCluster:
    names = ("manager", "worker-1", "worker-2")
    yield from _session_clusters(tmp_path_factory.mktemp("kueue-clusters"), workers=2,
                                 kueue_clusters=names,
                                 kueue_dispatcher=KUEUE_TEST_DISPATCHER,
                                 kueue_integrations=KUEUE_TEST_INTEGRATIONS, timeout=300)


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
    try:
        # No default Nodes: each test adds the kwok Nodes it needs, so capacity is its own.
        harness.up(timeout=timeout, node_layout=NodeLayout(default=[]), **up_args)
        multi = _connect(harness)
        yield multi
        for cluster in multi:
            cluster.api.close()
    finally:
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
