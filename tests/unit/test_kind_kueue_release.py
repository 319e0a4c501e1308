"""Kueue's release as `up --provider kind --kueue` applies it: Kueue's own config/default
rendered from the module cache, changed only where the kind clusters need it."""

from __future__ import annotations

import pytest
import yaml

from clusters import kueue as local_kueue
from clusters.kind import jobset
from clusters.kind import kueue as kind_kueue


def _one(documents: list[dict], kind: str, name: str) -> dict:
    [found] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def rendered() -> tuple[list[dict], list[dict]]:
    """Kueue's config/default as rendered, and as adapted for kind (an external dispatcher,
    batch Jobs and TrainJobs)."""
    return (list(kind_kueue._rendered()),
            kind_kueue.release("example.com/dispatcher",
                               ("batch/job", "trainer.kubeflow.org/trainjob")))


def test_only_the_deployment_and_the_configuration_change(rendered):
    """And the visibility API's APIServices are left out (clusters.kind.kueue's doc)."""
    original, adapted = rendered

    def key(d):
        return d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]

    visibility = [("APIService", None, name) for name in kind_kueue.VISIBILITY_APIS]
    assert [k for k in map(key, original) if k[0] == "APIService"] == visibility
    original = [d for d in original if key(d) not in visibility]
    assert [key(d) for d in adapted] == [key(d) for d in original]
    changed = {key(a) for a, o in zip(adapted, original, strict=True) if a != o}
    assert changed == {("Deployment", kind_kueue.NAMESPACE, kind_kueue.DEPLOYMENT),
                       ("ConfigMap", kind_kueue.NAMESPACE, kind_kueue.CONFIG_MAP)}


def test_the_controller_runs_the_image_built_here_on_the_control_plane(rendered):
    _, adapted = rendered
    pod = _one(adapted, "Deployment", kind_kueue.DEPLOYMENT)["spec"]["template"]["spec"]
    [manager] = [c for c in pod["containers"] if c["name"] == kind_kueue.CONTAINER]
    assert (manager["image"], manager["imagePullPolicy"]) == (
        "registry.k8s.io/kueue/kueue:v0.19.2", "IfNotPresent")
    assert manager["command"] == ["/manager"]  # where the image built here keeps it
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        65532, 65532)
    assert pod["nodeSelector"] == {jobset.CONTROL_PLANE_LABEL: ""}
    # The webhook Secret `up` fills first is the one the Pod mounts.
    assert {"name": "cert", "secret": {"defaultMode": 420,
                                       "secretName": kind_kueue.WEBHOOK_SECRET}} in pod["volumes"]


def test_the_configuration_is_the_releases_with_the_products_choices(rendered):
    original, adapted = rendered
    before = yaml.safe_load(_one(original, "ConfigMap", kind_kueue.CONFIG_MAP)["data"][
        kind_kueue.CONFIG_KEY])
    after = yaml.safe_load(_one(adapted, "ConfigMap", kind_kueue.CONFIG_MAP)["data"][
        kind_kueue.CONFIG_KEY])
    assert after["integrations"]["frameworks"] == ["batch/job", "trainer.kubeflow.org/trainjob"]
    assert after["multiKueue"]["dispatcherName"] == "example.com/dispatcher"
    assert after["featureGates"] == {"WorkloadRequestUseMergePatch": True}
    unchanged = {k: v for k, v in after.items()
                 if k not in ("integrations", "multiKueue", "featureGates")}
    assert unchanged == {k: v for k, v in before.items() if k != "integrations"}
    # Leader election, and internal certificate management by default (not set).
    assert after["leaderElection"]["leaderElect"] is True
    assert "internalCertManagement" not in after


def test_an_integration_the_harness_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="ray.io/rayjob: not served by this harness"):
        kind_kueue.release(local_kueue.DISPATCHER_ALL_AT_ONCE, ("ray.io/rayjob",))
