"""Every kind a MultiKueue team queues waits for this dispatcher once Kueue's
``multiKueue.dispatcherName`` names it (the setting is cluster-wide): batch Jobs and JobSets
are nominated by room like TrainJobs, and a Workload the dispatcher cannot size is still
dispatched (to every worker) with why said on it.

Real Kueue v0.19 (``kueue_multicluster``: a manager and two workers, each running Kueue with
the batch/job, JobSet and TrainJob integrations), the dispatcher in kueue mode, the jobs'
real pods on kwok Nodes.

Room, in an extended resource only this module's Nodes have (``example.com/kinds``, so the
Nodes other modules leave behind do not count) and in cpu quota:

* worker-1: a Node with 8 ``example.com/kinds`` (and 32 cpu), but 2 cpu of ClusterQueue quota;
* worker-2: a Node with 2 ``example.com/kinds`` (and 32 cpu), and 64 cpu of quota.

So a job asking much of ``example.com/kinds`` and little cpu fits worker-1 only (Node
room), and one asking little of it and more cpu than 2 fits worker-2 only (quota). Every
ClusterQueue covers ``example.com/kinds`` generously; the quotas found before are put back
afterwards.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kueue_queues
from clusters.pytest_plugin import KUEUE_TEST_DISPATCHER, _namespace_name
from clusters.testing import ServiceProcess, audited_writes, eventually
from dispatcher.kueue import workloads as kueue_workloads
from trainjob import constants as c

# The MultiKueueConfig and AdmissionCheck test_kueue.py sets up too: the same objects,
# whichever module runs first.
CONFIG = "kueue-e2e"
KINDS = "example.com/kinds"
KUEUE_ORIGIN = "multikueue"  # Kueue's default multiKueue.origin; kueue mode follows it
NODE_KINDS = {"worker-1": "8", "worker-2": "2"}
QUOTA_CPU = {"worker-1": "2", "worker-2": "64"}
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
BATCH_JOBS = ("batch", "v1")
# The Kueue binary's User-Agent (what its writes are told apart by in the audit logs).
KUEUE_USER_AGENT = "kueue/"


def _quota(cluster) -> dict[str, str] | None:
    """The ClusterQueue's nominal quota per resource, as ``kueue_queues`` writes it."""
    try:
        queue = cluster.custom.get_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, "clusterqueues", kueue_queues.CLUSTER_QUEUE)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    groups = (queue.get("spec") or {}).get("resourceGroups") or []
    return {r["name"]: str(r["nominalQuota"])
            for group in groups for flavor in group.get("flavors") or []
            for r in flavor.get("resources") or []} or None


@pytest.fixture(scope="module")
def kinds_env(kueue_multicluster, tmp_path_factory):
    mc = kueue_multicluster
    log_dir = tmp_path_factory.mktemp("kueue-kinds-logs")
    before = {cluster.name: _quota(cluster) for cluster in mc}
    for name, kinds in NODE_KINDS.items():
        fixtures.add_node(mc[name].api, f"{name}-kinds",
                          {"cpu": "32", "memory": "64Gi", "pods": "110", KINDS: kinds})
        kueue_queues.cluster_queue(mc[name].api, {"cpu": QUOTA_CPU[name], "memory": "256Gi",
                                                  KINDS: "100"})
    # The dispatcher reads each worker as the read-only worker-reader identity, with its own
    # Secrets in its own namespace; Kueue's are in Kueue's.
    readers = {name: kueue_queues.worker_reader(mc.harness, name, mc[name].kubeconfig,
                                                log_dir / f"{name}-reader.kubeconfig")
               for name in NODE_KINDS}
    kueue_queues.multikueue_manager(mc.manager.api, CONFIG,
                                    {name: mc[name].kubeconfig for name in NODE_KINDS},
                                    {"cpu": "100", "memory": "512Gi", KINDS: "100"},
                                    dispatcher=readers)
    dispatcher = ServiceProcess(
        "dispatcher", mc.manager.kubeconfig, log_dir / "kueue-kinds.log",
        ("--mode", "kueue", "--dispatcher-name", KUEUE_TEST_DISPATCHER,
         "--namespace", kueue_queues.DISPATCHER_NAMESPACE,
         "--origin", KUEUE_ORIGIN, "--multikueue-config", CONFIG,
         "--admission-timeout", "60", "--no-leader-elect", "--log-level", "debug")).start()
    yield mc
    dispatcher.stop()
    for name in NODE_KINDS:
        mc[name].core.delete_node(f"{name}-kinds")
    for cluster in mc:
        if before[cluster.name]:
            kueue_queues.cluster_queue(
                cluster.api, before[cluster.name],
                admission_check=kueue_queues.ADMISSION_CHECK if cluster.role == "manager"
                else None)


@pytest.fixture
def kinds_namespace(kinds_env, request):
    """A namespace on every Kueue cluster, with the LocalQueue jobs are submitted to."""
    name = _namespace_name(request.node.name)
    for cluster in kinds_env:
        cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        kueue_queues.local_queue(cluster.api, name)
    yield name
    for cluster in kinds_env:
        cluster.core.delete_namespace(name)


def pod_spec(requests: dict[str, str] | None = None, pod_level: dict | None = None) -> dict:
    """A pod that kwok runs for its default 3 s; extended resources ask with a limit too,
    as the API requires."""
    resources = {}
    if requests:
        resources = {"requests": dict(requests),
                     "limits": {r: q for r, q in requests.items() if "/" in r}}
    spec = {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "resources": resources}]}
    if pod_level:
        spec["resources"] = pod_level
    return spec


def queued_batch_job(name: str, pods: int, spec: dict, min_pods: int | None = None) -> dict:
    """A batch Job submitted to the LocalQueue, as a Kueue user writes it."""
    meta = {"name": name, "labels": {c.KUEUE_QUEUE_NAME_LABEL: kueue_queues.LOCAL_QUEUE}}
    if min_pods is not None:
        meta["annotations"] = {"kueue.x-k8s.io/job-min-parallelism": str(min_pods)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": spec}}}


def queued_jobset(name: str, pods: int, spec: dict) -> dict:
    return {"apiVersion": f"{c.JOBSET_GROUP}/{c.JOBSET_VERSION}", "kind": c.JOBSET_KIND,
            "metadata": {"name": name,
                         "labels": {c.KUEUE_QUEUE_NAME_LABEL: kueue_queues.LOCAL_QUEUE}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {
                "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                         "template": {"spec": spec}}}}]}}


def create_job(cluster, namespace: str, body: dict) -> dict:
    return client.BatchV1Api(cluster.api).create_namespaced_job(namespace, body)


def read_job(cluster, namespace: str, name: str) -> dict | None:
    try:
        return cluster.api.sanitize_for_serialization(
            client.BatchV1Api(cluster.api).read_namespaced_job(name, namespace))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def read_jobset(cluster, namespace: str, name: str) -> dict | None:
    try:
        return cluster.custom.get_namespaced_custom_object(*JOBSET, namespace, c.JOBSETS, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def condition_true(obj: dict | None, type_: str) -> bool:
    return any(x.get("type") == type_ and x.get("status") == "True"
               for x in ((obj or {}).get("status") or {}).get("conditions") or [])


def workload_of(cluster, namespace: str, kind: str, job: str) -> dict | None:
    """The Workload Kueue made for the ``kind`` named ``job``."""
    items = cluster.custom.list_namespaced_custom_object(
        c.KUEUE_GROUP, c.KUEUE_VERSION, namespace, "workloads")["items"]
    return next((w for w in items if any(
        ref.get("kind") == kind and ref.get("name") == job
        for ref in w["metadata"].get("ownerReferences") or [])), None)


def events(cluster, namespace: str, reason: str) -> list[str]:
    return [e.message for e in cluster.core.list_namespaced_event(namespace).items
            if e.reason == reason]


def copies(env, read, namespace: str, name: str) -> dict[str, dict]:
    """Each worker's copy of the job (Kueue's)."""
    found = {w.name: read(w, namespace, name) for w in env.workers}
    return {n: o for n, o in found.items() if o is not None}


def pods_bound(worker, namespace: str, count: int) -> list:
    return eventually(lambda: worker.core.list_namespaced_pod(namespace).items,
                      lambda items: len(items) >= count and all(p.spec.node_name for p in items),
                      timeout=60, expected=f"{count} pods bound to Nodes on {worker.name}")


def test_a_batch_job_goes_to_the_worker_with_node_room_and_completes(kinds_env,
                                                                     kinds_namespace):
    """A batch Job of 2 pods × 2 ``example.com/kinds`` fits worker-1's Node (8) but not
    worker-2's (2): it is nominated to worker-1, Kueue copies it there only, its pods run on
    worker-1's kwok Node, and the manager's Job shows Complete."""
    env, ns = kinds_env, kinds_namespace
    create_job(env.manager, ns, queued_batch_job(
        "batch", 2, pod_spec({"cpu": "100m", KINDS: "2"})))
    said = eventually(lambda: events(env.manager, ns, "Nominated"), lambda seen: bool(seen),
                      timeout=60, expected="a Nominated Event on the batch Job's Workload")
    assert said == ["nominated worker cluster worker-1"], (
        f"expected worker-1 (room on its Node), not worker-2 (2 {KINDS} on its Node); "
        f"saw {said}")
    placed = eventually(lambda: copies(env, read_job, ns, "batch"), lambda seen: bool(seen),
                        timeout=60, expected="Kueue's copy of the batch Job on a worker")
    assert list(placed) == ["worker-1"], (
        f"expected Kueue's copy on worker-1 only; saw it on {sorted(placed)}")
    pods = pods_bound(env["worker-1"], ns, 2)
    assert {p.spec.node_name for p in pods} == {"worker-1-kinds"}, (
        f"expected the pods on worker-1's kwok Node; saw {[p.spec.node_name for p in pods]}")
    done = eventually(lambda: read_job(env.manager, ns, "batch"),
                      lambda job: condition_true(job, "Complete") or condition_true(job, "Failed"),
                      timeout=90, expected="the manager's batch Job finished")
    assert condition_true(done, "Complete"), (
        f"expected Complete on the manager's Job; saw {done.get('status')}")
    workload = workload_of(env.manager, ns, "Job", "batch")
    assert workload["status"].get("clusterName") == "worker-1", (
        f"expected Kueue to admit it on worker-1; saw {workload['status']}")
    assert read_job(env["worker-2"], ns, "batch") is None, "expected no copy on worker-2"


def test_a_jobset_goes_to_the_worker_with_quota_and_completes(kinds_env, kinds_namespace):
    """A JobSet of 2 pods × 2 cpu (4 cpu) fits worker-1's Node but not its ClusterQueue
    (2 cpu), and both on worker-2 (64 cpu of quota, a Node with the 2 ``example.com/kinds``
    it asks): it is nominated to worker-2, Kueue copies it there only, the JobSet controller
    runs its pods on worker-2's kwok Node, and the manager's JobSet shows Completed."""
    env, ns = kinds_env, kinds_namespace
    env.manager.custom.create_namespaced_custom_object(
        *JOBSET, ns, c.JOBSETS, queued_jobset("jobset", 2, pod_spec({"cpu": "2", KINDS: "1"})))
    said = eventually(lambda: events(env.manager, ns, "Nominated"), lambda seen: bool(seen),
                      timeout=60, expected="a Nominated Event on the JobSet's Workload")
    assert said == ["nominated worker cluster worker-2"], (
        f"expected worker-2 (quota room), not worker-1 (Node room, 2 cpu of quota); saw {said}")
    placed = eventually(lambda: copies(env, read_jobset, ns, "jobset"), lambda seen: bool(seen),
                        timeout=60, expected="Kueue's copy of the JobSet on a worker")
    assert list(placed) == ["worker-2"], (
        f"expected Kueue's copy on worker-2 only; saw it on {sorted(placed)}")
    pods = pods_bound(env["worker-2"], ns, 2)
    assert {p.spec.node_name for p in pods} == {"worker-2-kinds"}, (
        f"expected the pods on worker-2's kwok Node; saw {[p.spec.node_name for p in pods]}")
    done = eventually(lambda: read_jobset(env.manager, ns, "jobset"),
                      lambda js: condition_true(js, c.JOBSET_COMPLETED)
                      or condition_true(js, "Failed"),
                      timeout=90, expected="the manager's JobSet finished")
    assert condition_true(done, c.JOBSET_COMPLETED), (
        f"expected Completed on the manager's JobSet; saw {done.get('status')}")
    workload = workload_of(env.manager, ns, c.JOBSET_KIND, "jobset")
    assert workload["status"].get("clusterName") == "worker-2", (
        f"expected Kueue to admit it on worker-2; saw {workload['status']}")
    assert read_jobset(env["worker-1"], ns, "jobset") is None, "expected no copy on worker-1"


def test_a_partially_admissible_job_goes_where_its_minimum_fits(kinds_env, kinds_namespace):
    """A batch Job of 4 pods × (1.5 cpu, 1 ``example.com/kinds``) that accepts 2
    (``kueue.x-k8s.io/job-min-parallelism``): no worker has room for 4 (worker-1's quota
    is 2 cpu, worker-2's Node 2 kinds), and only worker-2 for 2 (3 cpu exceeds worker-1's
    quota). It is nominated to worker-2, saying it has room for 2 of 4 pods, rather than
    waiting; its pods run there (2 at a time) and the manager's Job shows Complete."""
    env, ns = kinds_env, kinds_namespace
    create_job(env.manager, ns, queued_batch_job(
        "partial", 4, pod_spec({"cpu": "1500m", KINDS: "1"}), min_pods=2))
    said = eventually(lambda: events(env.manager, ns, "Nominated"), lambda seen: bool(seen),
                      timeout=60, expected="a Nominated Event on the Job's Workload")
    assert said == ["nominated worker cluster worker-2 (room for 2 of its 4 pods only: the "
                    "podSets' minCount, as Kueue's partial admission allows)"], said
    done = eventually(lambda: read_job(env.manager, ns, "partial"),
                      lambda job: condition_true(job, "Complete") or condition_true(job, "Failed"),
                      timeout=120, expected="the manager's batch Job finished")
    assert condition_true(done, "Complete"), (
        f"expected Complete on the manager's Job; saw {done.get('status')}")
    workload = workload_of(env.manager, ns, "Job", "partial")
    assert workload["status"].get("clusterName") == "worker-2", workload["status"]
    assert read_job(env["worker-1"], ns, "partial") is None, "expected no copy on worker-1"


def test_an_unsizable_workload_is_nominated_to_every_worker_and_says_why(kinds_env,
                                                                         kinds_namespace):
    """A batch Job whose pods ask through pod-level resources (Kubernetes 1.34), which the
    dispatcher does not read: it does not wait for a nomination. The Workload is nominated
    to every worker (Kueue creates a remote Workload on each), an ``Unsizable`` Event and
    the Workload's ``trainjob-dispatcher.io/Sized=False`` condition say why, naming the
    podSet and field, and the first worker whose Kueue admits it runs it to Complete."""
    env, ns = kinds_env, kinds_namespace
    create_job(env.manager, ns, queued_batch_job("podlevel", 1, pod_spec(
        pod_level={"requests": {"cpu": "100m", "memory": "64Mi"},
                   "limits": {"cpu": "100m", "memory": "64Mi"}})))
    why = ("cannot size the Workload, so no worker is chosen by room: spec.podSets[0] (main): "
           "template.spec.resources (cpu, memory) sets pod-level resources, which this "
           "dispatcher does not read (it counts container requests only); nominated every "
           "worker cluster (worker-1, worker-2), as Kueue's all-at-once dispatcher would: the "
           "first whose Kueue admits it runs it")
    said = eventually(lambda: events(env.manager, ns, kueue_workloads.UNSIZABLE_REASON),
                      lambda seen: bool(seen), timeout=60,
                      expected="an Unsizable Event on the Job's Workload")
    assert said == [why], f"expected one Unsizable Event saying {why!r}; saw {said}"
    workload = workload_of(env.manager, ns, "Job", "podlevel")
    shown = kueue_workloads.sized_condition(workload) or {}
    assert (shown.get("status"), shown.get("reason"), shown.get("message")) == (
        "False", kueue_workloads.UNSIZABLE_REASON, why), (
        f"expected the Workload's {kueue_workloads.SIZED_CONDITION} condition False, "
        f"Unsizable, saying why; saw {shown or workload.get('status')}")
    done = eventually(lambda: read_job(env.manager, ns, "podlevel"),
                      lambda job: condition_true(job, "Complete") or condition_true(job, "Failed"),
                      timeout=90, expected="the manager's batch Job finished")
    assert condition_true(done, "Complete"), (
        f"expected Complete on the manager's Job; saw {done.get('status')}")
    admitted = workload_of(env.manager, ns, "Job", "podlevel")
    assert admitted["status"].get("clusterName") in NODE_KINDS, admitted["status"]
    # Kueue kept the condition through its own status writes.
    assert kueue_workloads.sized_condition(admitted) is not None, admitted["status"]
    remote_workloads = {w.name: [r for r in audited_writes(w, KUEUE_USER_AGENT)
                                 if r["namespace"] == ns and r["resource"] == "workloads"
                                 and r["verb"] == "create"] for w in env.workers}
    assert all(remote_workloads.values()), (
        f"expected Kueue to create the remote Workload on every worker (all nominated); the "
        f"workers' audit logs show {remote_workloads}")
    assert events(env.manager, ns, "Nominated") == [] and \
        events(env.manager, ns, "NoWorkerFits") == [], (
        "expected no nomination by room and no NoWorkerFits for an unsizable Workload")
