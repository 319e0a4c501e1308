"""The kind clusters the kind tests share: a manager and two workers with one kind worker
node each, brought up once per session (three kind clusters take a minute or two to start on
two cores, so the deployed-product tests and the provider's own tests use the same ones).
``test_deployed_product.py`` runs first (modules run in name order) and deploys the product;
``test_kind_clusters.py`` ends with ``down``.

The clusters carry a prefix of their own (``trainjob-t<hex>-``), so clusters a developer runs
with `python -m clusters up --provider kind` are never touched.
"""

from __future__ import annotations

import secrets

import pytest

from clusters import images
from clusters.kind import KindClusters

from kind_layout import LAYOUT


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
