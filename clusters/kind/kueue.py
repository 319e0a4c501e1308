"""Kueue (the version ``clusters/binaries.py`` pins) on a kind cluster, installed as a team
installs a release: the objects of Kueue's own ``config/default`` kustomization (what its
release ``manifests.yaml`` is built from), rendered from the Kueue module in the Go module
cache, applied server-side, running the image built here
(``registry.k8s.io/kueue/kueue:<version>``, the name the release manifests give it;
``python -m clusters images --only kueue``) once it is ``kind load``-ed. Nothing of Kueue's is
copied into this repository, and no registry is reached.

What the rendered release is changed in, and why:
  * the manager container's image: ``config/default`` names the staging registry's ``main``
    tag (the release process sets the published name); ours has the published name, and
    ``imagePullPolicy: IfNotPresent`` so the kubelet uses the loaded copy;
  * the pod runs as 65532: the image built here is ``FROM scratch`` without a USER, and
    the release asks for ``runAsNonRoot`` (upstream's distroless image says 65532 itself);
  * it is pinned to the control-plane node (with the toleration for its taint), so a
    worker's Nodes stay all the workloads', as JobSet's controller is (``jobset``);
  * its Configuration (ConfigMap ``kueue-manager-config``), as the local provider's
    (``clusters.kueue.configuration``) in what matters to the product: the integrations
    asked for (``up --kueue-integration``; TrainJobs alone by default), the MultiKueue
    ``dispatcherName`` (``up --kueue-dispatcher``) and ``WorkloadRequestUseMergePatch``;
    the rest is the release's (leader election, ports, the visibility server);
  * the release's APIServices for Kueue's visibility API (``VISIBILITY_APIS``) are left
    out: on these kind clusters the aggregator's availability check gets a 404 from the
    visibility server and the APIServices stay ``FailedDiscoveryCheck``, and while any
    aggregated API is unavailable, discovery is incomplete and the namespace controller
    deletes no namespace, anyone's. Nothing here uses that API (``kubectl get --raw
    /apis/visibility.kueue.x-k8s.io/...``, pending-workload listings).

Webhook certificates: Kueue 0.19 manages them itself by default (``internalCertManagement``:
it fills the Secret ``kueue-webhook-server-cert`` and injects its CA into the webhook
configurations, the converting CRDs and keeps them renewed), but a Secret it fills only
reaches the Pod's mounted volume at the kubelet's next sync, a minute or more later. So the
Secret is made first, with a CA and certificate Kueue's rotator accepts and keeps
(``clusters.kueue.KueueCertificates``): the Pod starts with them mounted.
"""

from __future__ import annotations

import base64
import copy
import functools
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import binaries, kustomize
from clusters import kueue as local_kueue
from clusters.controlplane import ControlPlaneError
from clusters.kind import jobset, waits
from controller_kit.kubeclient import api_client

COMPONENT = local_kueue.COMPONENT
VERSION = binaries.COMPONENTS[COMPONENT].version
IMAGE = f"registry.k8s.io/kueue/kueue:{VERSION}"
NAMESPACE = local_kueue.NAMESPACE
DEPLOYMENT = "kueue-controller-manager"
CONTAINER = "manager"
CONFIG_MAP = local_kueue.CONFIG_MAP
CONFIG_KEY = local_kueue.CONFIG_KEY
WEBHOOK_SECRET = local_kueue.WEBHOOK_SECRET
WEBHOOK_SERVICE = local_kueue.WEBHOOK_SERVICE
# The release's aggregated APIs (Kueue's visibility server, in the same Pod), left out of
# the installation (module doc).
VISIBILITY_APIS = ("v1beta1.visibility.kueue.x-k8s.io", "v1beta2.visibility.kueue.x-k8s.io")
FIELD_MANAGER = "trainjob-clusters"


@functools.lru_cache(maxsize=1)
def _rendered() -> tuple[dict, ...]:
    source = binaries.module_dir(COMPONENT) / "config" / "default"
    out = kustomize.kubectl(None, "kustomize", str(source))
    if out.returncode != 0:
        raise ControlPlaneError(f"kubectl kustomize {source} failed: {out.stderr.strip()}")
    # 1.7 MB, most of it the Workload CRD: libyaml when PyYAML has it.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(out.stdout, Loader=loader) if d)


def _one(documents: list[dict], kind: str, name: str) -> dict:
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        raise ControlPlaneError(f"Kueue's config/default: expected one {kind} {name}, found "
                                f"{len(found)}: Kueue's release layout changed")
    return found[0]


def configuration(documents: list[dict], dispatcher: str,
                  integrations: tuple[str, ...]) -> dict:
    """The release's Configuration with the product's choices (see the module doc)."""
    config_map = _one(documents, "ConfigMap", CONFIG_MAP)
    config = yaml.safe_load(config_map["data"][CONFIG_KEY])
    config["integrations"] = {**(config.get("integrations") or {}),
                              "frameworks": list(local_kueue.check_integrations(integrations))}
    config["multiKueue"] = {**(config.get("multiKueue") or {}), "dispatcherName": dispatcher}
    config["featureGates"] = {**(config.get("featureGates") or {}),
                              "WorkloadRequestUseMergePatch": True}
    return config


def release(dispatcher: str = local_kueue.DISPATCHER_ALL_AT_ONCE,
            integrations: tuple[str, ...] = local_kueue.INTEGRATIONS) -> list[dict]:
    """Kueue's release objects, adapted to run from the loaded image with the product's
    Configuration (see the module doc)."""
    documents = [d for d in copy.deepcopy(list(_rendered()))
                 if not (d["kind"] == "APIService" and d["metadata"]["name"] in VISIBILITY_APIS)]
    config_map = _one(documents, "ConfigMap", CONFIG_MAP)
    config_map["data"][CONFIG_KEY] = yaml.safe_dump(
        configuration(documents, dispatcher, integrations), sort_keys=False)
    pod = _one(documents, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]
    managers = [c for c in pod["containers"] if c["name"] == CONTAINER]
    if len(managers) != 1:
        raise ControlPlaneError(f"Kueue's config/default: no container {CONTAINER} in "
                                f"Deployment {DEPLOYMENT}: Kueue's release layout changed")
    jobset.run_loaded_image_on_control_plane(pod, managers[0], IMAGE)
    return documents


def ensure_webhook_secret(api: client.ApiClient, pki: Path) -> None:
    """Kueue's namespace and its webhook Secret holding certificates Kueue keeps (made from
    ``pki`` when the Secret is missing; one already there, Kueue's or ours, is kept)."""
    core = client.CoreV1Api(api)
    for create in (
            lambda: core.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=NAMESPACE))),
            lambda: core.create_namespaced_secret(NAMESPACE, client.V1Secret(
                metadata=client.V1ObjectMeta(name=WEBHOOK_SECRET, namespace=NAMESPACE),
                data={k: base64.b64encode(v).decode() for k, v in local_kueue.KueueCertificates(
                    pki).ensure(hosts=(f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local",))
                    .secret_data().items()}))):
        try:
            create()
        except ApiException as err:
            if err.status != 409:
                raise


def install(kubeconfig: Path, pki: Path, dispatcher: str,
            integrations: tuple[str, ...]) -> None:
    """Apply Kueue's release (server-side, taking over fields an earlier install set) after
    its webhook Secret (``ensure_webhook_secret``)."""
    documents = release(dispatcher, integrations)
    with api_client(kubeconfig) as api:
        ensure_webhook_secret(api, pki)
    out = kustomize.kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts",
                            f"--field-manager={FIELD_MANAGER}", "-f", "-",
                            stdin=yaml.dump_all(documents, Dumper=getattr(
                                yaml, "CSafeDumper", yaml.SafeDumper)), timeout=180)
    if out.returncode != 0:
        raise ControlPlaneError(f"applying Kueue's release failed: {out.stderr.strip()[-2000:]}")


PROBE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "harness-probe"}}


def _webhook_answers(api: client.ApiClient) -> str | None:
    """Why a Kueue object cannot be created yet (None once a server-side dry run passes
    Kueue's mutating and validating webhooks for ResourceFlavors)."""
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "resourceflavors", PROBE, dry_run="All")
    except ApiException as err:
        return f"dry-run ResourceFlavor create: {err.status} {err.reason}: {(err.body or '')[:300]}"
    return None


def ready_problem(api: client.ApiClient) -> str | None:
    """Why Kueue is not ready yet: its Deployment not rolled out or its webhooks not
    answering (None once both are)."""
    return waits.deployment_problem(api, NAMESPACE, DEPLOYMENT) or _webhook_answers(api)


def wait_ready(api: client.ApiClient, cluster: str, timeout: float) -> None:
    """Until Kueue's Deployment is rolled out and its webhooks admit a ResourceFlavor (dry
    run)."""
    waits.wait_for(f"{cluster}: Kueue's controller", lambda: ready_problem(api),
                   time.monotonic() + timeout)


# Kueue's own identity on a MultiKueue worker, as Kueue's MultiKueue guide sets one up: the
# manager's Kueue connects with it (its Secret in kueue-system on the manager) to create the
# Workloads and jobs it copies there, read them back and delete them. Rules from the kinds
# Kueue's MultiKueue adapters write on a worker at VERSION (its batch Job, JobSet and
# TrainJob adapters create, get, list, watch and delete the job and read its status; the
# Workload is created, updated and its status patched; the worker's queues are read).
MULTIKUEUE_ACCOUNT = "multikueue"
MULTIKUEUE_ROLE = "multikueue-worker"
MULTIKUEUE_TOKEN_SECRET = "multikueue-token"
_JOB_VERBS = ["create", "delete", "get", "list", "watch"]


def multikueue_worker_identity() -> list[dict]:
    """The ServiceAccount (with a long-lived token Secret), ClusterRole and binding a
    manager's Kueue reaches this worker as."""
    rules = [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
         "verbs": [*_JOB_VERBS, "update", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues", "localqueues"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    for group, resource in local_kueue.SUPPORTED_INTEGRATIONS.values():
        rules.append({"apiGroups": [group], "resources": [resource], "verbs": _JOB_VERBS})
        rules.append({"apiGroups": [group], "resources": [f"{resource}/status"],
                      "verbs": ["get"]})
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": MULTIKUEUE_ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": MULTIKUEUE_TOKEN_SECRET, "namespace": NAMESPACE,
                      "annotations": {"kubernetes.io/service-account.name":
                                      MULTIKUEUE_ACCOUNT}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": MULTIKUEUE_ROLE}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": MULTIKUEUE_ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": MULTIKUEUE_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": MULTIKUEUE_ACCOUNT,
                       "namespace": NAMESPACE}]},
    ]
