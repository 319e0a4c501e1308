"""The remote view on kind (``deploy --remote-api``): the optional base manifests/remote-api
on the manager, as a team adds it (docs/remote-view.md, "Deploying it"):

1. the manager's overlay with the component ``manifests/remote-api/serving`` (the
   dispatcher's Deployment serves the aggregated API on port 6443 of every interface): an
   overlay of two lines in the state directory, ``remote-api-overlay/``, whose resource is
   the chosen ``manifests/<overlay>`` and whose component is the shipped one, applied in
   place of the plain overlay;
2. right after, before any wait, that base but its APIService: the Service in front of
   every ready dispatcher Pod, the users' ClusterRole, and the dispatcher's RBAC, without
   which a replica serving the remote view never turns ready (it reads the front proxy's
   settings and keeps its certificate first);
3. once the Service's endpoints are every dispatcher Pod, ready, leader and standby alike,
   ``kubectl apply --server-side -k manifests/remote-api`` (the APIService joins), and wait
   until it is ``Available=True`` (the dispatcher put its CA into the APIService; the
   manager's aggregator reached it through the Service and its discovery answered).
   Last, because the aggregator keeps the connection of its first discovery check: one
   made before kube-proxy programmed the Service's address leaves the node unrouted, and
   where something answers there (a transparent proxy) the APIService stays unavailable
   with that answer's status, though every replica serves.

kind's kube-apiserver is kubeadm's, which runs with the aggregation layer's flags
(``--requestheader-*``, ``--proxy-client-cert-file``) and publishes them in ConfigMap
``kube-system/extension-apiserver-authentication``: nothing on the cluster is changed.

``remove`` is ``kubectl delete -k manifests/remote-api``: the APIService first of all (an
unavailable one blocks discovery and namespace deletion on the whole cluster). The
dispatcher keeps serving its port, to nobody, until the plain overlay is applied again.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import kustomize
from clusters.controlplane import ControlPlaneError
from clusters.crds import manifests_dir

BASE = "remote-api"
COMPONENT = "remote-api/serving"
OVERLAY_DIR = "remote-api-overlay"
APIREGISTRATION = ("apiregistration.k8s.io", "v1", "apiservices")


def _shipped() -> tuple[str, str, str]:
    """The APIService's name and its Service's namespace and name, read from the base."""
    objects = kustomize.render(BASE)
    [apiservice] = [o for o in objects if o["kind"] == "APIService"]
    service = apiservice["spec"]["service"]
    return apiservice["metadata"]["name"], service["namespace"], service["name"]


def overlay(state_dir: Path, manager_overlay: str) -> Path:
    """The directory of a kustomization of ``manifests/<manager_overlay>`` with the
    ``serving`` component, written in ``state_dir`` (kustomize takes bases and components
    by relative path only, so they are named relative to it)."""
    directory = Path(state_dir) / OVERLAY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    # Checked here: kustomize's own error names a path the caller never wrote.
    base, component = kustomize.base_path(manager_overlay), manifests_dir() / COMPONENT
    if not (component / "kustomization.yaml").is_file():
        raise FileNotFoundError(f"manifests/{COMPONENT}: no kustomization.yaml in {component}")
    text = ("# Written by `python -m clusters deploy --remote-api`: the manager's overlay and\n"
            "# the remote view's serving component (docs/remote-view.md).\n"
            "apiVersion: kustomize.config.k8s.io/v1beta1\n"
            "kind: Kustomization\n"
            f"resources:\n  - {os.path.relpath(base, directory)}\n"
            f"components:\n  - {os.path.relpath(component, directory)}\n")
    path = directory / "kustomization.yaml"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return directory


def apiservice_problem(api: client.ApiClient) -> str | None:
    """Why the remote view's APIService is not Available (None once it is)."""
    name, _, _ = _shipped()
    try:
        found = client.CustomObjectsApi(api).get_cluster_custom_object(*APIREGISTRATION, name)
    except ApiException as err:
        return f"APIService {name}: {err.status} {err.reason}"
    available = next((x for x in (found.get("status") or {}).get("conditions") or []
                      if x.get("type") == "Available"), None)
    if available is None:
        return f"APIService {name}: no Available condition yet"
    if available.get("status") != "True":
        return (f"APIService {name}: Available={available.get('status')} "
                f"{available.get('reason')}: {available.get('message')}")
    if not found["spec"].get("caBundle"):
        return f"APIService {name}: Available without a caBundle"
    return None


def endpoints_problem(api: client.ApiClient, namespace: str, deployment: str) -> str | None:
    """Why the Service in front of the remote view does not route to every Pod of the
    dispatcher's Deployment (None once its ready endpoints are exactly those Pods)."""
    _, service_namespace, service = _shipped()
    core = client.CoreV1Api(api)
    selector = ",".join(f"{k}={v}" for k, v in (client.AppsV1Api(api).read_namespaced_deployment(
        deployment, namespace).spec.selector.match_labels or {}).items())
    pods = {p.status.pod_ip: p.metadata.name
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None and p.status.pod_ip}
    slices = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        service_namespace, label_selector=f"kubernetes.io/service-name={service}").items
    ready = {address for s in slices for e in s.endpoints or []
             if (e.conditions is None or e.conditions.ready is not False)
             for address in e.addresses}
    if not pods or ready != set(pods):
        return (f"Service {service_namespace}/{service}: ready endpoints {sorted(ready)}; "
                f"dispatcher Pods {pods}")
    return None


def remove(kubeconfig: Path, timeout: float = 120) -> None:
    """``kubectl delete -k manifests/remote-api``, waiting until its objects are gone."""
    out = kustomize.kubectl(kubeconfig, "delete", "-k", str(kustomize.base_path(BASE)),
                            "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s",
                            timeout=timeout + 30)
    if out.returncode != 0:
        raise ControlPlaneError(f"kubectl delete -k manifests/{BASE} failed: "
                                f"{out.stderr.strip()[-2000:]}")
