"""The dispatcher in Kueue mode deployed as Pods, on kind: Kueue v0.19.2 from its release
manifests on the manager and on both workers (`up --kueue` on every cluster, the batch/job,
JobSet and TrainJob integrations, the manager's ``multiKueue.dispatcherName`` the overlay's
``--dispatcher-name``), and `deploy --manager-overlay manager-kueue` putting the dispatcher
next to the manager's Kueue as its external MultiKueue dispatcher.

* deploy registers each worker twice under one name: the dispatcher's Secret (the read-only
  manifests/worker-reader identity) in its own namespace, Kueue's (Kueue's MultiKueue
  identity on the worker) in kueue-system; Kueue reports every MultiKueueCluster Active;
* a TrainJob, a batch Job and a JobSet, each queued in the team's LocalQueue on the manager,
  are each nominated by the dispatcher to the one worker whose ClusterQueue has room for
  it, copied there by Kueue (there only), run as real containers (the trainjob-workload
  image) and show their finished condition on the manager, where their Workload names the
  nominated worker;
* `kubectl delete -k manifests/manager-kueue` removes the overlay's objects and nothing
  else: Kueue's namespace, Deployment, CRDs, Secrets (its worker Secrets too), queues,
  MultiKueue objects, Workloads and every user job stay, and Kueue still reaches the workers.

Room is ClusterQueue quota, which the dispatcher reads on each worker: worker-1's queue has
cpu but little memory, worker-2's memory but little cpu.

The Kueue kind clusters of ``conftest.py`` (``kueue_kind``: Kueue on all three, its manager's
``multiKueue.dispatcherName`` the overlay's ``--dispatcher-name``), after the product
deployed beside Kueue there was removed (``test_kueue_beside_on_kind.py``): what that left
(its team's objects, the worker registrations deploy re-points to Kueue's identity) is part
of the inventory taken before this deploy.
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_deployed_product import create, get, is_true, trainjob, workload_runtime
from test_kueue_beside_on_kind import KUEUES_OWN, Deployed, Removal, kueue_inventory

from clusters import fixtures, images, kueue, kueue_queues
from clusters.kind import KindClusters
from clusters.kind import kueue as kind_kueue
from clusters.kind.deploy import KUEUE_MODE
from clusters.testing import eventually
from controller_kit.kubeclient import api_client, apply_custom_object
from trainjob import constants as c

from kind_layout import NAMES, overlay_flag

WORKERS = NAMES[1:]
USER_NAMESPACE = "team-kueue"
CONFIG = "kind-multikueue"
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
# Each worker's ClusterQueue: what fits one does not fit the other.
WORKER_QUOTA = {"worker-1": {"cpu": "1", "memory": "64Mi"},
                "worker-2": {"cpu": "300m", "memory": "1Gi"}}
MANAGER_QUOTA = {"cpu": "4", "memory": "4Gi"}
# Long enough for Kueue's copy on the worker to be seen before Kueue deletes it.
RUN_FOR = "8s"


def inventory(api) -> set[str]:
    """``kueue_inventory`` and the team's batch Jobs and JobSets."""
    found = kueue_inventory(api)
    for job in client.BatchV1Api(api).list_job_for_all_namespaces().items:
        found.add(f"Job/{job.metadata.namespace}/{job.metadata.name}")
    for jobset in client.CustomObjectsApi(api).list_cluster_custom_object(
            *JOBSET, c.JOBSETS)["items"]:
        found.add(f"JobSet/{jobset['metadata']['namespace']}/{jobset['metadata']['name']}")
    return found


def team_queues(kind: KindClusters) -> None:
    """What a MultiKueue team has before the product (Kueue's MultiKueue guide): on each
    worker a ClusterQueue with that worker's quota and the LocalQueue; on the manager the
    MultiKueueConfig naming the workers, the MultiKueue AdmissionCheck, a ClusterQueue
    requiring it and the LocalQueue. The runtime everywhere (Kueue's TrainJob webhook reads
    it on the manager, the operator on the workers)."""
    for name in NAMES:
        with api_client(kind.kubeconfig(name)) as api:
            fixtures.ensure_namespace(api, USER_NAMESPACE)
            fixtures.install_runtime(api, workload_runtime())
            if name == "manager":
                fixtures.register_config(api, CONFIG, list(WORKERS))
                apply_custom_object(api, c.KUEUE_GROUP, c.KUEUE_VERSION, "admissionchecks", {
                    "apiVersion": f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}",
                    "kind": "AdmissionCheck",
                    "metadata": {"name": kueue_queues.ADMISSION_CHECK},
                    "spec": {"controllerName": kueue.MULTIKUEUE_CONTROLLER,
                             "parameters": {"apiGroup": c.KUEUE_GROUP,
                                            "kind": "MultiKueueConfig", "name": CONFIG}}},
                    fixtures.FIELD_MANAGER)
                kueue_queues.cluster_queue(api, MANAGER_QUOTA,
                                           admission_check=kueue_queues.ADMISSION_CHECK)
                client.CoreV1Api(api).create_namespaced_secret(USER_NAMESPACE, client.V1Secret(
                    metadata=client.V1ObjectMeta(name="kept"),
                    string_data={"token": "team's own"}))
            else:
                kueue_queues.cluster_queue(api, WORKER_QUOTA[name])
            kueue_queues.local_queue(api, USER_NAMESPACE)


@pytest.fixture(scope="module")
def deployed(kueue_kind):
    team_queues(kueue_kind)
    with api_client(kueue_kind.kubeconfig("manager")) as api:
        before = inventory(api)
    return Deployed.overlay(kueue_kind, KUEUE_MODE, before)


def kubeconfig_subject(api, namespace: str, name: str) -> str:
    """Who the kubeconfig in Secret ``namespace/name`` authenticates as: the subject of its
    ServiceAccount token (a JWT)."""
    secret = client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    config = yaml.safe_load(base64.b64decode(secret.data["kubeconfig"]))
    payload = config["users"][0]["user"]["token"].split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"]


def active(api, worker: str) -> dict | None:
    cluster = client.CustomObjectsApi(api).get_cluster_custom_object(
        c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, worker)
    return next((x for x in (cluster.get("status") or {}).get("conditions") or []
                 if x.get("type") == "Active"), None)


def test_the_dispatcher_runs_in_kueue_mode_with_two_identities_per_worker(deployed, manager):
    core = client.CoreV1Api(manager)
    dispatchers = core.list_namespaced_pod("trainjob-system").items
    assert sorted(p.status.phase for p in dispatchers) == ["Running", "Running"], (
        [(p.metadata.name, p.status.phase) for p in dispatchers])
    assert all("--mode=kueue" in p.spec.containers[0].args for p in dispatchers)
    for name in NAMES:
        with deployed.api(name) as api:
            assert kind_kueue.ready_problem(api) is None, name
    config = core.read_namespaced_config_map(kind_kueue.CONFIG_MAP, kind_kueue.NAMESPACE)
    assert f"dispatcherName: {overlay_flag('dispatcher-name')}" in config.data[
        kind_kueue.CONFIG_KEY], config.data[kind_kueue.CONFIG_KEY]
    # One name, two Secrets: the dispatcher reads a worker as worker-reader, Kueue writes
    # there as its own identity, and Kueue's connection is Active.
    for worker in WORKERS:
        secret = f"{worker}-kubeconfig"
        assert kubeconfig_subject(manager, "trainjob-system", secret) == (
            "system:serviceaccount:trainjob-system:trainjob-dispatcher-reader")
        assert kubeconfig_subject(manager, kind_kueue.NAMESPACE, secret) == (
            f"system:serviceaccount:{kind_kueue.NAMESPACE}:{kind_kueue.MULTIKUEUE_ACCOUNT}")
        condition = active(manager, worker)
        assert condition and condition["status"] == "True", (worker, condition)


def workload_of(api, kind: str, name: str) -> dict | None:
    """The Workload Kueue made on the manager for the job ``kind``/``name``."""
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        c.KUEUE_GROUP, c.KUEUE_VERSION, USER_NAMESPACE, "workloads")["items"]
    return next((w for w in items if any(
        r.get("kind") == kind and r.get("name") == name
        for r in w["metadata"].get("ownerReferences") or [])), None)


def nominations(api, workload: str) -> list[str]:
    """The messages of the dispatcher's Nominated Events on the Workload."""
    return [e.message for e in client.CoreV1Api(api).list_namespaced_event(
        USER_NAMESPACE, field_selector=f"involvedObject.name={workload}").items
        if e.reason == "Nominated"]


def _absent_on_404(read):
    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


READERS = {
    "TrainJob": lambda api, name: _absent_on_404(lambda: get(api, USER_NAMESPACE, name)),
    "Job": lambda api, name: _absent_on_404(lambda: api.sanitize_for_serialization(
        client.BatchV1Api(api).read_namespaced_job(name, USER_NAMESPACE))),
    "JobSet": lambda api, name: _absent_on_404(
        lambda: client.CustomObjectsApi(api).get_namespaced_custom_object(
            *JOBSET, USER_NAMESPACE, c.JOBSETS, name)),
}
FINISHED = {"TrainJob": (c.CONDITION_COMPLETE, c.CONDITION_FAILED),
            "Job": ("Complete", "Failed"),
            "JobSet": (c.JOBSET_COMPLETED, c.JOBSET_FAILED)}


def container(cpu: str, memory: str) -> dict:
    return {"name": "main", "image": images.WORKLOAD_IMAGE, "imagePullPolicy": "IfNotPresent",
            "args": ["--run-for", RUN_FOR],
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}


def pod_template(cpu: str, memory: str) -> dict:
    return {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [container(cpu, memory)]}}


def queued(body: dict) -> dict:
    body["metadata"]["namespace"] = USER_NAMESPACE
    body["metadata"].setdefault("labels", {})[c.KUEUE_QUEUE_NAME_LABEL] = (
        kueue_queues.LOCAL_QUEUE)
    return body


def submit(api, kind: str, name: str) -> str:
    """Queue the job ``kind``/``name`` on the manager; return the worker whose ClusterQueue
    alone has room for it."""
    if kind == "TrainJob":
        # One pod of 500m cpu, 16Mi: worker-1's cpu.
        body = queued(trainjob(name, USER_NAMESPACE, "--run-for", RUN_FOR, cpu="500m",
                               managed_by=None))
        create(api, body)
        return "worker-1"
    if kind == "Job":
        # One pod of 128Mi: worker-2's memory.
        client.BatchV1Api(api).create_namespaced_job(USER_NAMESPACE, queued({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "template": pod_template("100m", "128Mi")}}))
        return "worker-2"
    # Two pods of 250m cpu (500m): worker-1's cpu.
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        *JOBSET, USER_NAMESPACE, c.JOBSETS, queued({
            "apiVersion": c.JOBSET_API_VERSION, "kind": c.JOBSET_KIND,
            "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {
                "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                         "template": pod_template("250m", "16Mi")}}}]}}))
    return "worker-1"


@pytest.mark.parametrize("kind", ["TrainJob", "Job", "JobSet"])
def test_a_queued_job_is_nominated_by_room_and_completes(deployed, manager, kind):
    name = f"queued-{kind.lower()}"
    roomy = submit(manager, kind, name)
    workload = eventually(lambda: workload_of(manager, kind, name), lambda w: w is not None,
                          timeout=60, expected=f"Kueue's Workload for {kind} {name}")
    workload_name = workload["metadata"]["name"]
    said = eventually(lambda: nominations(manager, workload_name), bool, timeout=90,
                      interval=0.5,
                      expected=f"the dispatcher's Nominated Event on Workload {workload_name}")
    assert said == [f"nominated worker cluster {roomy}"], (
        f"expected {kind} {name} nominated to {roomy}, the one worker whose ClusterQueue has "
        f"room ({WORKER_QUOTA}); saw {said}")
    read = READERS[kind]
    # Kueue copies it to the nominated worker only, where its pods run, and deletes the
    # copy once the job is finished: every worker is looked at until then.
    seen_on: set[str] = set()
    workers = {w: api_client(deployed.kind.kubeconfig(w)) for w in WORKERS}

    def finished_on_manager() -> dict | None:
        seen_on.update(w for w, api in workers.items() if read(api, name) is not None)
        return read(manager, name)
    try:
        done = eventually(finished_on_manager, lambda job: job is not None and any(
                              is_true(job, t) for t in FINISHED[kind]),
                          timeout=240, interval=0.5,
                          expected=f"{kind} {name} finished on the manager (Kueue's status sync)")
    finally:
        for api in workers.values():
            api.close()
    assert is_true(done, FINISHED[kind][0]), (
        f"expected {kind} {name} {FINISHED[kind][0]} on the manager; saw {done.get('status')}")
    assert seen_on == {roomy}, (
        f"expected Kueue's copy of {kind} {name} on {roomy} only while it ran; saw it on "
        f"{sorted(seen_on)}")
    admitted = workload_of(manager, kind, name)
    assert admitted["status"].get("clusterName") == roomy, (
        f"expected Kueue to have admitted Workload {workload_name} on {roomy}; saw "
        f"{admitted['status']}")
    with deployed.api(roomy) as api:
        eventually(lambda: read(api, name), lambda copy: copy is None, timeout=60,
                   interval=0.5, expected=f"Kueue's finished copy of {kind} {name} deleted "
                   f"from {roomy}")


def test_removing_the_overlay_leaves_kueue_and_every_other_object(deployed, manager):
    """Last: the overlay goes while Kueue, its queues, its worker Secrets and every user
    job (each finished through Kueue) are there."""
    removal = Removal(deployed, manager, KUEUE_MODE, inventory)
    # The overlay's namespace went whole, with what deploy stored there (the dispatcher's
    # worker Secrets).
    assert {f"Secret/trainjob-system/{w}-kubeconfig" for w in WORKERS} <= removal.gone_with
    after = removal.after
    kept = KUEUES_OWN | {
            "CustomResourceDefinition//multikueueclusters.kueue.x-k8s.io",
            "CustomResourceDefinition//trainjobs.trainer.kubeflow.org",
            "CustomResourceDefinition//jobsets.jobset.x-k8s.io",
            f"AdmissionCheck//{kueue_queues.ADMISSION_CHECK}", f"MultiKueueConfig//{CONFIG}",
            f"ClusterQueue//{kueue_queues.CLUSTER_QUEUE}",
            f"LocalQueue/{USER_NAMESPACE}/{kueue_queues.LOCAL_QUEUE}",
            f"Secret/{USER_NAMESPACE}/kept"}
    assert kept <= deployed.before & after, kept - (deployed.before & after)
    # What deploy registered for Kueue stays (it is Kueue's, not the overlay's), and so
    # does every user job with its Workload.
    registered = {f"MultiKueueCluster//{w}" for w in WORKERS} | {
        f"Secret/{kind_kueue.NAMESPACE}/{w}-kubeconfig" for w in WORKERS}
    jobs = {f"{kind}/{USER_NAMESPACE}/queued-{kind.lower()}" for kind in READERS}
    assert registered | jobs <= after, (registered | jobs) - after
    added = after - deployed.before - registered - jobs
    assert {k for k in added if not k.startswith(f"Workload/{USER_NAMESPACE}/")} == set(), (
        added)
    assert len(added) == len(jobs), f"expected one Workload per job; saw {added}"
    # Kueue still answers and still reaches the workers with its own Secrets.
    assert kind_kueue.ready_problem(manager) is None
    for worker in WORKERS:
        condition = active(manager, worker)
        assert condition and condition["status"] == "True", (worker, condition)
