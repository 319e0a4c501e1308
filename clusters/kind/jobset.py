"""JobSet's controller on a kind worker: its release, rendered from the JobSet module's own
kustomization (``config/default`` in the Go module cache), running the image built here
(``registry.k8s.io/jobset/jobset:<version>``, ``python -m clusters images``) once it is
``kind load``-ed into the cluster. No registry is reached.

What the rendered release is changed in, and why:
  * the manager container's image: the release names the staging registry; ours has the
    published name, and ``imagePullPolicy: IfNotPresent`` so the kubelet uses the loaded copy;
  * the pod runs as 65532: the harness's image is ``FROM scratch`` without a USER, and the
    release asks for ``runAsNonRoot`` (upstream's distroless image says 65532 itself);
  * it is pinned to the control-plane node (with the toleration for its taint), so the
    worker Nodes are all the workloads', as the local provider's JobSet is no Node's.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import binaries, kustomize
from clusters.controlplane import ControlPlaneError
from clusters.kind import waits

VERSION = binaries.COMPONENTS["jobset-controller"].version
IMAGE = f"registry.k8s.io/jobset/jobset:{VERSION}"
NAMESPACE = "jobset-system"
DEPLOYMENT = "jobset-controller-manager"
NONROOT = 65532
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
GROUP, API_VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


def release() -> list[dict]:
    """JobSet's release objects, adapted to run from the loaded image (see the module doc)."""
    source = binaries.module_dir("jobset-controller") / "config" / "default"
    rendered = kustomize.kubectl(None, "kustomize", str(source))
    if rendered.returncode != 0:
        raise ControlPlaneError(f"kubectl kustomize {source} failed: {rendered.stderr.strip()}")
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    deployments = [d for d in documents if d["kind"] == "Deployment"
                   and d["metadata"]["name"] == DEPLOYMENT]
    if len(deployments) != 1:
        raise ControlPlaneError(f"{source}: expected one Deployment {DEPLOYMENT}, found "
                                f"{len(deployments)}: JobSet's release layout changed")
    pod = deployments[0]["spec"]["template"]["spec"]
    managers = [c for c in pod["containers"] if c.get("image", "").endswith(f"/jobset:{VERSION}")]
    if len(managers) != 1:
        raise ControlPlaneError(f"{source}: no container running jobset:{VERSION} in "
                                f"Deployment {DEPLOYMENT}: JobSet's release layout changed")
    run_loaded_image_on_control_plane(pod, managers[0], IMAGE)
    return documents


def run_loaded_image_on_control_plane(pod: dict, container: dict, image: str) -> None:
    """Adapt a release's controller Pod spec to this harness: ``container`` runs ``image``
    as loaded into the nodes (never pulled), as a non-root user (the images built here set
    none), on the control-plane node (kept off the worker nodes whose room tests count)."""
    container["image"] = image
    container["imagePullPolicy"] = "IfNotPresent"
    pod.setdefault("securityContext", {}).update(runAsUser=NONROOT, runAsGroup=NONROOT)
    pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), CONTROL_PLANE_LABEL: ""}
    pod["tolerations"] = [*(pod.get("tolerations") or []),
                          {"key": CONTROL_PLANE_LABEL, "operator": "Exists",
                           "effect": "NoSchedule"}]


def install(kubeconfig: Path) -> None:
    kustomize.apply(kubeconfig, release())


PROBE = {
    "apiVersion": f"{GROUP}/{API_VERSION}", "kind": "JobSet",
    "metadata": {"name": "harness-probe"},
    "spec": {"replicatedJobs": [{"name": "probe", "replicas": 1, "template": {"spec": {
        "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "probe", "image": "registry.k8s.io/pause:3.10.1"}]}}}}}]},
}


def _webhook_answers(api: client.ApiClient) -> str | None:
    """Why a JobSet cannot be created yet (None once a server-side dry run passes JobSet's
    admission webhooks)."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, API_VERSION, "default", PLURAL, PROBE, dry_run="All")
    except ApiException as err:
        return f"dry-run JobSet create: {err.status} {err.reason}: {(err.body or '')[:300]}"
    return None


def wait_ready(api: client.ApiClient, cluster: str, timeout: float) -> None:
    """Until JobSet's Deployment is rolled out and its webhooks admit a JobSet."""
    waits.wait_for(f"{cluster}: JobSet's controller",
                   lambda: (waits.deployment_problem(api, NAMESPACE, DEPLOYMENT)
                            or _webhook_answers(api)), time.monotonic() + timeout)
