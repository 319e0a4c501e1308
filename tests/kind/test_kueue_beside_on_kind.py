"""The dispatcher deployed as Pods beside an in-cluster Kueue, on kind: `up --kueue` installs
Kueue v0.19.2 from its release manifests (its Deployment running the image built here),
`deploy --manager-overlay manager-beside-kueue` puts the dispatcher next to it.

* a TrainJob for the dispatcher (managedBy kueue.x-k8s.io/multikueue, no queue label) runs
  on a worker and shows Complete on the manager;
* a TrainJob queued in a Kueue LocalQueue is left to Kueue: Kueue makes its Workload, the
  dispatcher writes its `LeftToKueue` Event and never copies it to the worker;
* `kubectl delete -k manifests/manager-beside-kueue` removes the overlay's objects and
  nothing else: Kueue's namespace, Deployment, CRDs, Secrets, ConfigMap, queues, webhooks
  and every user TrainJob stay.

The Kueue kind clusters of ``conftest.py`` (``kueue_kind``: a manager and two workers, each
running Kueue with a MultiKueue team's integrations and an external dispatcherName, which
holds no job without a queue label): this module sorts after test_kind_clusters.py, which
ends the shared ones, so the two sets are never up together, and before
test_kueue_mode_on_kind.py, which deploys the product in Kueue mode on the same clusters
once this module has removed it.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from test_deployed_product import (
    conditions,
    create,
    get,
    inventory,
    is_true,
    job_namespace,
    objects,
    trainjob,
    trainjob_names,
    worker_of,
    workload_runtime,
)

from clusters import fixtures, kustomize
from clusters.kind import KindClusters
from clusters.kind import kueue as kind_kueue
from clusters.kind.deploy import BESIDE_KUEUE, deploy
from clusters.testing import eventually, holds_for
from controller_kit.kubeclient import api_client
from trainjob import constants as c

from kind_layout import NAMES

WORKERS = NAMES[1:]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "kind-flavor", "kind-cluster-queue", "kind-user-queue"
USER_NAMESPACE = "user-team"


def kueue_inventory(api) -> set[str]:
    """``inventory`` and Kueue's own objects: queues, registrations, Workloads, and the
    aggregated APIs."""
    found = inventory(api)
    custom = client.CustomObjectsApi(api)
    for plural, kind in (("resourceflavors", "ResourceFlavor"),
                         ("clusterqueues", "ClusterQueue"), ("localqueues", "LocalQueue"),
                         ("admissionchecks", "AdmissionCheck"),
                         ("multikueueclusters", "MultiKueueCluster"),
                         ("multikueueconfigs", "MultiKueueConfig"), ("workloads", "Workload")):
        for item in custom.list_cluster_custom_object(*KUEUE, plural)["items"]:
            meta = item["metadata"]
            found.add(f"{kind}/{meta.get('namespace', '')}/{meta['name']}")
    for service in client.ApiregistrationV1Api(api).list_api_service().items:
        found.add(f"APIService//{service.metadata.name}")
    return found


def queues(api, namespace: str) -> None:
    """A ClusterQueue of no quota and its LocalQueue: a job queued there waits in Kueue."""
    custom = client.CustomObjectsApi(api)
    for plural, body in (
            ("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}),
            ("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
                               "spec": {"namespaceSelector": {}, "resourceGroups": [{
                                   "coveredResources": ["cpu", "memory"],
                                   "flavors": [{"name": FLAVOR, "resources": [
                                       {"name": "cpu", "nominalQuota": "0"},
                                       {"name": "memory", "nominalQuota": "0"}]}]}]}})):
        custom.create_cluster_custom_object(*KUEUE, plural,
                                            {"apiVersion": "/".join(KUEUE), **body})
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE}})


class Deployed:
    def __init__(self, kind: KindClusters, before: set[str]):
        self.kind = kind
        self.before = before

    def api(self, name: str):
        return api_client(self.kind.kubeconfig(name))

    @classmethod
    def overlay(cls, kind: KindClusters, overlay: str, before: set[str]) -> Deployed:
        """The product deployed on ``kind`` with the manager from ``overlay``, after the
        manager's inventory ``before``."""
        report = deploy(kind, timeout=480, manager_overlay=overlay)
        print("deployed:", report.steps, f"{report.seconds:.0f} s")
        return cls(kind, before)


@pytest.fixture(scope="module")
def deployed(kueue_kind):
    """A team's objects first (its namespace with a Secret, a TrainJob for upstream
    Trainer's controller and a LocalQueue; the runtime on every cluster: Kueue's TrainJob
    webhook reads it on the manager), then the product beside Kueue."""
    for name in NAMES:
        with api_client(kueue_kind.kubeconfig(name)) as api:
            fixtures.ensure_namespace(api, USER_NAMESPACE)
            fixtures.install_runtime(api, workload_runtime())
    with api_client(kueue_kind.kubeconfig("manager")) as api:
        client.CoreV1Api(api).create_namespaced_secret(USER_NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name="kept"), string_data={"token": "team's own"}))
        create(api, trainjob("kept", USER_NAMESPACE,
                             managed_by=c.MANAGED_BY_TRAINER_CONTROLLER))
        queues(api, USER_NAMESPACE)
        before = kueue_inventory(api)
    return Deployed.overlay(kueue_kind, BESIDE_KUEUE, before)


def test_the_dispatcher_runs_as_pods_beside_kueues_deployment(deployed, manager):
    core = client.CoreV1Api(manager)
    kueue_pods = core.list_namespaced_pod(kind_kueue.NAMESPACE).items
    assert [(p.status.phase, p.spec.containers[0].image) for p in kueue_pods] == [
        ("Running", kind_kueue.IMAGE)], [(p.metadata.name, p.status.phase) for p in kueue_pods]
    dispatchers = core.list_namespaced_pod("trainjob-system").items
    assert sorted(p.status.phase for p in dispatchers) == ["Running", "Running"]
    assert {p.spec.node_name for p in kueue_pods + dispatchers} == {
        n.metadata.name for n in core.list_node().items}
    # Kueue runs with the TrainJob integration, as its ConfigMap (which the dispatcher reads)
    # says.
    config = core.read_namespaced_config_map(kind_kueue.CONFIG_MAP, kind_kueue.NAMESPACE)
    assert "- trainer.kubeflow.org/trainjob" in config.data[kind_kueue.CONFIG_KEY]


def test_the_dispatchers_job_completes_and_a_queued_job_is_left_to_kueue(deployed, manager):
    namespace = job_namespace(deployed)
    with deployed.api("manager") as api:
        queues_api = client.CustomObjectsApi(api)
        queues_api.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE}})
    queued = trainjob("queued", namespace, "--run-for", "1s")
    queued["metadata"]["labels"] = {c.KUEUE_QUEUE_NAME_LABEL: LOCAL_QUEUE}
    create(manager, queued)
    create(manager, trainjob("own", namespace, "--run-for", "3s"))

    # Kueue manages the queued job: its Workload, owned by the TrainJob, waits for quota.
    def workloads() -> list[str]:
        listed = client.CustomObjectsApi(manager).list_namespaced_custom_object(
            *KUEUE, namespace, "workloads")["items"]
        return [o["metadata"]["name"] for o in listed
                if any(r.get("name") == "queued" for r in o["metadata"].get(
                    "ownerReferences") or [])]
    eventually(workloads, bool, expected="Kueue's Workload for TrainJob queued", timeout=60)

    def left_events() -> list:
        return [e for e in client.CoreV1Api(manager).list_namespaced_event(
            namespace, field_selector="involvedObject.name=queued").items
            if e.reason == "LeftToKueue"]
    [left] = eventually(left_events, lambda found: len(found) == 1, timeout=60,
                        expected="one LeftToKueue Event on TrainJob queued")
    assert c.KUEUE_QUEUE_NAME_LABEL in left.message, left.message

    done = eventually(lambda: get(manager, namespace, "own"),
                      lambda job: is_true(job, c.CONDITION_COMPLETE), timeout=180,
                      expected="TrainJob own Complete=True on the manager")
    assert worker_of(done) in WORKERS, worker_of(done)
    # The queued job, all the while: no copy on any worker, no placement.
    workers = [deployed.api(name) for name in WORKERS]
    try:
        holds_for(lambda: ([n for w in workers for n in trainjob_names(w, namespace)],
                           worker_of(get(manager, namespace, "queued"))),
                  lambda seen: "queued" not in seen[0] and seen[1] is None, seconds=3,
                  expected="no copy of TrainJob queued on a worker and no placement")
    finally:
        for worker in workers:
            worker.close()
    assert not is_true(get(manager, namespace, "queued"), c.CONDITION_COMPLETE)
    assert conditions(get(manager, namespace, "queued")).get(c.CONDITION_PLACED) is None


# Kueue's own objects on the manager, which removing the product leaves.
KUEUES_OWN = {f"Deployment/{kind_kueue.NAMESPACE}/{kind_kueue.DEPLOYMENT}",
              f"Namespace//{kind_kueue.NAMESPACE}",
              f"ConfigMap/{kind_kueue.NAMESPACE}/{kind_kueue.CONFIG_MAP}",
              f"Secret/{kind_kueue.NAMESPACE}/{kind_kueue.WEBHOOK_SECRET}",
              "CustomResourceDefinition//workloads.kueue.x-k8s.io"}


class Removal:
    """An overlay removed with ``kubectl delete -k``: what it installed, the inventory at
    its removal and after it, and what went with the overlay's own namespaces. Whatever
    was there before the deploy (``deployed.before``) and is not the overlay's stays."""

    def __init__(self, deployed: Deployed, manager, overlay: str, take_inventory):
        kind = deployed.kind
        self.installed = {
            f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
            for o in kustomize.render(overlay)}
        self.at_removal = take_inventory(manager)
        assert self.installed <= self.at_removal, \
            f"not deployed: {self.installed - self.at_removal}"
        result = kustomize.kubectl(kind.kubeconfig("manager"), "delete", "-k",
                                   str(kustomize.base_path(overlay)), "--ignore-not-found",
                                   "--wait=true", "--timeout=180s", timeout=240)
        if result.returncode != 0:
            # What holds the namespace: its conditions name what is left or what failed.
            namespace = client.CoreV1Api(manager).read_namespace("trainjob-system")
            left = [(x.type, x.status, x.message) for x in namespace.status.conditions or []]
            pytest.fail(f"kubectl delete -k: {result.stderr}; trainjob-system: {left}")
        self.after = take_inventory(manager)
        assert self.after & self.installed == set(), f"left behind: {self.after & self.installed}"
        # The overlay's own namespaces go whole, with what others made there (the worker
        # Secrets deploy stored, the ServiceAccount and CA ConfigMap of every namespace).
        own = {key.split("/", 2)[2] for key in self.installed if key.startswith("Namespace//")}
        self.gone_with = {key for key in self.at_removal if key.split("/", 2)[1] in own}
        kept = self.at_removal - self.installed - self.gone_with
        assert kept <= self.after, f"removed though not the overlay's: {kept - self.after}"
        assert self.after - self.at_removal == set(), f"new: {self.after - self.at_removal}"
        lost = deployed.before - self.installed - self.after
        assert not lost, f"removed though there before the product: {lost}"


def test_removing_the_overlay_leaves_kueue_and_every_other_object(deployed, manager):
    """Last: the overlay goes while Kueue, its queues and every user TrainJob (the
    dispatcher's finished one, Kueue's queued one) are there."""
    removal = Removal(deployed, manager, BESIDE_KUEUE, kueue_inventory)
    after = removal.after
    # Among what was there before the product (all of which stays): Kueue's namespace,
    # Deployment, CRDs, Secrets, ConfigMap, queues, webhooks and API groups, and the
    # team's objects.
    kept = KUEUES_OWN | {
            "MutatingWebhookConfiguration//kueue-mutating-webhook-configuration",
            f"APIService//v1beta2.{c.KUEUE_GROUP}",
            f"ClusterQueue//{CLUSTER_QUEUE}", f"LocalQueue/{USER_NAMESPACE}/{LOCAL_QUEUE}",
            f"TrainJob/{USER_NAMESPACE}/kept", f"Secret/{USER_NAMESPACE}/kept"}
    assert kept <= deployed.before & after, kept - (deployed.before & after)
    # What deploy added beside the overlay: the worker registrations (cluster-scoped
    # MultiKueueClusters; their Secrets went with trainjob-system) and the test's namespace.
    added = {k for k in after - deployed.before
             if not k.split("/", 2)[1].startswith("kind-")
             and not k.startswith("Namespace//kind-")}
    assert added == {f"MultiKueueCluster//{w}" for w in WORKERS}, added
    # Kueue still answers once the dispatcher is gone.
    assert kind_kueue.ready_problem(manager) is None
    assert objects(manager).get_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, USER_NAMESPACE, c.TRAINJOBS, "kept")
