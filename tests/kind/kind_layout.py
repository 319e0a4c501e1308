"""The Node layout of the kind tests' clusters (``conftest.py``), for the tests that check it."""

from __future__ import annotations

from clusters import nodes

POOL_LABEL = "trainjob.test/pool"
# PreferNoSchedule: the taint is honoured and seen on the Node, and the worker's own pods (the
# training operator's) still have a Node to run on.
TAINT = nodes.Taint(key="trainjob.test/dedicated", value="kind", effect="PreferNoSchedule")
# One kind worker node per worker cluster: enough to run pods, and light on two cores.
LAYOUT = nodes.NodeLayout(
    default=[nodes.NodePool(count=1, labels={POOL_LABEL: "plain"})],
    workers={"worker-2": [nodes.NodePool(count=1, labels={POOL_LABEL: "tainted"},
                                         taints=[TAINT])]},
)
NAMES = ("manager", "worker-1", "worker-2")
