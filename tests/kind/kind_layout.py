"""How the kind tests' clusters are made (``conftest.py``), for the tests that check it: the
Node layout of the shared ones, and the dispatcher name the Kueue ones' Kueue waits for."""

from __future__ import annotations

from clusters import kustomize, nodes
from clusters.kind.deploy import KUEUE_MODE

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


def overlay_flag(name: str) -> str:
    """The value of the dispatcher's ``--<name>=`` flag in the Kueue-mode overlay's
    Deployment."""
    deployment = next(o for o in kustomize.render(KUEUE_MODE) if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    [value] = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value
