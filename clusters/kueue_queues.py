"""The objects a MultiKueue user creates, as Kueue's MultiKueue set-up guide describes them:

* on the manager: a ResourceFlavor, an AdmissionCheck run by Kueue's MultiKueue
  (``kueue.x-k8s.io/multikueue``) with a MultiKueueConfig as its parameters, the
  MultiKueueConfig listing the workers, one MultiKueueCluster per worker (its kubeconfig in
  a Secret in ``kueue-system``), a ClusterQueue that uses the AdmissionCheck, and a
  LocalQueue per namespace;
* on each worker: the same ResourceFlavor, a ClusterQueue with that worker's quota and the
  same-named LocalQueue in each namespace (a remote Workload is admitted there).

And what Kueue mode adds for this project's dispatcher: on each worker the read-only
identity of manifests/worker-reader, and on the manager the dispatcher's own Secret per
worker, of the name Kueue's has, in the dispatcher's namespace (never Kueue's).
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from clusters import fixtures, kueue, kustomize
from clusters.pki import service_account_user
from controller_kit.kubeclient import apply_custom_object
from trainjob import constants as c

FLAVOR = "default-flavor"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
ADMISSION_CHECK = "multikueue-check"
QUEUE_NAME_LABEL = c.KUEUE_QUEUE_NAME_LABEL
# The Kueue-mode dispatcher's own namespace (--namespace), as the shipped Deployment's: its
# Lease and its worker Secrets. Never Kueue's (the dispatcher refuses that in kueue mode).
DISPATCHER_NAMESPACE = "trainjob-system"
# manifests/worker-reader: the identity a Kueue-mode dispatcher reads a worker with, in the
# namespace manifests/worker-namespace declares.
WORKER_READER = "worker-reader"
WORKER_NAMESPACE = "worker-namespace"
WORKER_READER_ACCOUNT = ("trainjob-system", "trainjob-dispatcher-reader")
_IDENTITY_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def _apply(api: client.ApiClient, plural: str, body: dict) -> None:
    apply_custom_object(api, c.KUEUE_GROUP, c.KUEUE_VERSION, plural,
                        {"apiVersion": f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", **body},
                        fixtures.FIELD_MANAGER)


def cluster_queue(api: client.ApiClient, quota: dict[str, str],
                  admission_check: str | None = None) -> None:
    """The ResourceFlavor and a ClusterQueue with ``quota`` of it (cpu and memory, and any
    other resource the jobs ask for, e.g. GPUs), open to every namespace;
    ``admission_check`` names the AdmissionCheck every Workload needs."""
    _apply(api, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
    spec: dict = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(quota), "flavors": [{
            "name": FLAVOR,
            "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}]}],
    }
    if admission_check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    _apply(api, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
                                  "spec": spec})


def local_queue(api: client.ApiClient, namespace: str) -> None:
    _apply(api, "localqueues", {"kind": "LocalQueue",
                                "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
                                "spec": {"clusterQueue": CLUSTER_QUEUE}})


def worker_reader(harness, worker: str, kubeconfig: Path, path: Path) -> Path:
    """manifests/worker-reader's identity objects applied on ``worker`` (as its admin, with
    ``kubeconfig``) after its namespace (manifests/worker-namespace), and a kubeconfig that
    authenticates as its ServiceAccount (a client certificate from the worker's CA) written
    to ``path``."""
    objects = [o for base in (WORKER_NAMESPACE, WORKER_READER) for o in kustomize.render(base)
               if o["kind"] in _IDENTITY_KINDS]
    kustomize.apply(kubeconfig, objects)
    user, groups = service_account_user(*WORKER_READER_ACCOUNT)
    return harness.issue_user_kubeconfig(worker, user, groups, path)


def dispatcher_secret(manager: client.ApiClient, worker: str, kubeconfig: Path,
                      namespace: str = DISPATCHER_NAMESPACE) -> None:
    """The Kueue-mode dispatcher's own Secret for ``worker``: named as the one Kueue reads
    (the MultiKueueCluster's location), in the dispatcher's namespace."""
    fixtures.store_kubeconfig(manager, f"{worker}-kubeconfig", kubeconfig, namespace)


def multikueue_manager(manager: client.ApiClient, config: str,
                       workers: dict[str, Path], quota: dict[str, str],
                       dispatcher: dict[str, Path] | None = None) -> None:
    """The manager's side: workers registered (Kueue's Secret in Kueue's namespace +
    MultiKueueCluster each), the MultiKueueConfig ``config`` listing them in order, the
    MultiKueue AdmissionCheck and a ClusterQueue with ``quota`` that requires it;
    ``dispatcher``: the kubeconfig per worker of a Kueue-mode dispatcher's own Secret."""
    for name, kubeconfig in workers.items():
        fixtures.register_worker(manager, name, kubeconfig, namespace=kueue.NAMESPACE)
    for name, kubeconfig in (dispatcher or {}).items():
        dispatcher_secret(manager, name, kubeconfig)
    fixtures.register_config(manager, config, list(workers))
    _apply(manager, "admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": ADMISSION_CHECK},
        "spec": {"controllerName": kueue.MULTIKUEUE_CONTROLLER,
                 "parameters": {"apiGroup": c.KUEUE_GROUP, "kind": "MultiKueueConfig",
                                "name": config}}})
    cluster_queue(manager, quota, admission_check=ADMISSION_CHECK)
