"""The kind clusters the kind tests share.

* ``kind_clusters`` (session): a manager and two workers with one kind worker node each,
  brought up once per session (three kind clusters take a minute or two to start on two
  cores, so the deployed-product tests and the provider's own tests use the same ones).
  ``test_deployed_product.py`` runs first (modules run in name order) and deploys the
  product; ``test_kind_clusters.py`` ends with ``down``.
* ``kueue_kind`` (module, on demand: ``clusters.pytest_plugin.on_demand``): a manager and two
  workers, each running Kueue v0.19.2 from its release manifests with the integrations a
  MultiKueue team enables and the Kueue-mode overlay's dispatcher name, upstream Trainer's
  CRDs on the manager; a kind worker node per worker (a worker's control plane holds its
  own pods, JobSet's and Kueue's controllers: 1.95 of a kind node's 2 cpu of requests).
  The product deployed beside Kueue (``test_kueue_beside_on_kind.py``) and then in Kueue
  mode (``test_kueue_mode_on_kind.py``) use the same ones, brought up after ``down`` of the
  shared ones above and removed after the last of them.

Each set carries a prefix of its own (``trainjob-t<hex>-``, ``trainjob-k<hex>-``), so
clusters a developer runs with `python -m clusters up --provider kind` are never touched.
"""

from __future__ import annotations

import secrets
import time

import pytest

from clusters import images, kueue, nodes
from clusters.kind import KindClusters
from clusters.pytest_plugin import on_demand

from kind_layout import LAYOUT, NAMES, overlay_flag


@pytest.fixture(scope="session")
def kind_clusters(docker_engine, tmp_path_factory):
    harness = KindClusters(tmp_path_factory.mktemp("kind-clusters"),
                           prefix=f"trainjob-t{secrets.token_hex(2)}-", engine=docker_engine)
    try:
        harness.up(workers=2, timeout=360, node_layout=LAYOUT)
        if not images.image_exists(docker_engine, images.WORKLOAD_IMAGE):
            images.build_images(docker_engine, only=("workload",))
        harness.load_images("worker-1", [images.WORKLOAD_IMAGE])
        yield harness
    finally:
        harness.down()


@pytest.fixture(scope="session")
def _kueue_kind(docker_engine, tmp_path_factory, pytestconfig):
    def start():
        harness = KindClusters(tmp_path_factory.mktemp("kueue-kind"),
                               prefix=f"trainjob-k{secrets.token_hex(2)}-",
                               engine=docker_engine)
        started = time.monotonic()
        try:
            harness.up(workers=2, timeout=600, node_layout=nodes.NodeLayout(
                           default=[nodes.NodePool(count=1)]),
                       upstream_crds=("manager",), kueue_clusters=NAMES,
                       kueue_dispatcher=overlay_flag("dispatcher-name"),
                       kueue_integrations=kueue.MULTIKUEUE_TEAM_INTEGRATIONS)
            print(f"up with Kueue on every cluster: {time.monotonic() - started:.0f} s")
            yield harness
        finally:
            harness.down()
            print(f"Kueue's kind clusters up to down: {time.monotonic() - started:.0f} s")

    clusters = on_demand(pytestconfig, "kueue_kind", start)
    yield clusters
    clusters.stop()


@pytest.fixture(scope="module")
def kueue_kind(_kueue_kind) -> KindClusters:
    return _kueue_kind.get()


@pytest.fixture(scope="module")
def manager(deployed):
    """An API client of the manager of the module's ``deployed`` product (a module
    deploying it defines ``deployed``)."""
    with deployed.api("manager") as api:
        yield api
