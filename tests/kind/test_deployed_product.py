"""The product as a team runs it, on kind: `python -m clusters deploy` builds the images,
`kind load`s them and applies the shipped bases (manifests/manager, manifests/worker); the
dispatcher runs as its two-replica Deployment with a Lease on the manager, the training
operator as its Deployment with its webhook on each worker, and the pods of each TrainJob
run real containers (the trainjob-workload image) on the workers' kind nodes.

* a TrainJob submitted to the manager runs on a worker and shows Complete on the manager;
  one whose container exits 1 shows Failed with the worker's reason;
* a job too large for any worker waits with a reason, and runs once room appears;
* the leading dispatcher Pod is deleted: the other replica takes the Lease over, and no job
  gets a second copy;
* the operator made its own webhook certificate: a valid TrainJob is admitted and an invalid
  one refused by its webhook;
* the operator Deployment is rolled out with a short certificate validity while TrainJobs are
  created: none is refused through the rollout and two certificate rotations;
* `kubectl delete -k` of the two bases removes what was deployed and nothing else: every
  CRD, and a team's own TrainJobs and Secrets, stay (last).

Modules run in name order, so this one runs before test_kind_clusters.py on the session's
kind clusters (conftest.py).
"""

from __future__ import annotations

import datetime
import secrets
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, images, kustomize
from clusters.kind import waits
from clusters.kind.deploy import MANAGER_BASE, WORKER_BASE, Shipped, deploy
from clusters.testing import eventually
from controller_kit.kubeclient import api_client
from trainjob import constants as c

from kind_layout import NAMES

WORKERS = NAMES[1:]
RUNTIME = "kind-workload"
# What a job of the room test asks for: more than half of a kind worker node's 2 cpu (this
# machine's), so one such job fills a worker and a second waits.
LARGE_CPU = "1200m"
# The Secret the operator keeps its webhook certificate in (its --webhook-cert-secret).
WEBHOOK_SECRET = "training-operator-webhook-cert"
SHORT_VALIDITY = 30


def workload_runtime() -> dict:
    """A ClusterTrainingRuntime of one trainer step running the workload image (loaded into
    the workers' nodes; never pulled). The Job does not retry, so a container that exits 1
    fails the job at once."""
    container = {"name": c.NODE, "image": images.WORKLOAD_IMAGE,
                 "imagePullPolicy": "IfNotPresent",
                 "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}
    return {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": RUNTIME},
        "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
            "name": c.NODE,
            "template": {"metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                         "spec": {"backoffLimit": 0, "template": {"spec": {
                             "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                             "containers": [container]}}}}}]}}},
    }


def trainjob(name: str, namespace: str, *args: str, cpu: str | None = None,
             managed_by: str | None = c.MANAGED_BY_MULTIKUEUE, suspend: bool = False) -> dict:
    trainer: dict = {"args": list(args)}
    if cpu:
        trainer["resourcesPerNode"] = {"requests": {"cpu": cpu, "memory": "16Mi"}}
    spec: dict = {"runtimeRef": {"name": RUNTIME, "apiGroup": c.TRAINER_GROUP,
                                 "kind": c.CLUSTERTRAININGRUNTIME_KIND},
                  "trainer": trainer}
    if managed_by:
        spec["managedBy"] = managed_by
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def objects(api) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create(api, body: dict) -> dict:
    return objects(api).create_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, body["metadata"]["namespace"], c.TRAINJOBS, body)


def get(api, namespace: str, name: str) -> dict:
    return objects(api).get_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name)


def trainjob_names(api, namespace: str) -> set[str]:
    listed = objects(api).list_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS)
    return {o["metadata"]["name"] for o in listed["items"]}


def conditions(job: dict) -> dict[str, dict]:
    return {x["type"]: x for x in (job.get("status") or {}).get("conditions") or []}


def is_true(job: dict, kind: str) -> bool:
    return conditions(job).get(kind, {}).get("status") == "True"


def worker_of(job: dict) -> str | None:
    return (job["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)


def trainer_pods(api, namespace: str, job: str) -> list[client.V1Pod]:
    return client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}").items


# --- what a cluster holds, for `kubectl delete -k` -----------------------------------

ROOT_CA = "kube-root-ca.crt"


def root_ca_published(core: client.CoreV1Api) -> None:
    """Wait until the controller-manager has published its root CA ConfigMap into every
    active namespace. It does so shortly after a namespace is made, so an inventory taken
    before that would count the ConfigMap as new when it is taken again."""
    def missing() -> set[str]:
        active = {n.metadata.name for n in core.list_namespace().items
                  if n.status.phase == "Active"}
        published = {m.metadata.namespace for m in core.list_config_map_for_all_namespaces(
            field_selector=f"metadata.name={ROOT_CA}").items}
        return active - published

    eventually(missing, lambda left: not left, timeout=60, interval=0.5,
               expected=f"the {ROOT_CA} ConfigMap in every active namespace")


def inventory(api) -> set[str]:
    """Kind/namespace/name of the objects a deployment could add or remove, and of what a
    cluster's other users keep (their Secrets, ConfigMaps, TrainJobs)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    root_ca_published(core)
    apps = client.AppsV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    extensions = client.ApiextensionsV1Api(api)
    policy = client.PolicyV1Api(api)
    listings = {
        "Namespace": core.list_namespace,
        "Secret": core.list_secret_for_all_namespaces,
        "ConfigMap": core.list_config_map_for_all_namespaces,
        "PodDisruptionBudget": policy.list_pod_disruption_budget_for_all_namespaces,
        "ValidatingAdmissionPolicy": admission.list_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.list_validating_admission_policy_binding,
        "ServiceAccount": core.list_service_account_for_all_namespaces,
        "Service": core.list_service_for_all_namespaces,
        "Deployment": apps.list_deployment_for_all_namespaces,
        "CustomResourceDefinition": extensions.list_custom_resource_definition,
        "ClusterRole": rbac.list_cluster_role,
        "ClusterRoleBinding": rbac.list_cluster_role_binding,
        "Role": rbac.list_role_for_all_namespaces,
        "RoleBinding": rbac.list_role_binding_for_all_namespaces,
        "ValidatingWebhookConfiguration": admission.list_validating_webhook_configuration,
        "MutatingWebhookConfiguration": admission.list_mutating_webhook_configuration,
    }
    found = set()
    for kind, listing in listings.items():
        for item in listing().items:
            found.add(f"{kind}/{item.metadata.namespace or ''}/{item.metadata.name}")
    for job in objects(api).list_cluster_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                                       c.TRAINJOBS)["items"]:
        found.add(f"TrainJob/{job['metadata']['namespace']}/{job['metadata']['name']}")
    return found


def rendered_keys(base: str) -> set[str]:
    return {f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
            for o in kustomize.render(base)}


def is_test_namespace(key: str) -> bool:
    kind, namespace, name = key.split("/", 2)
    return (namespace or (name if kind == "Namespace" else "")).startswith("kind-")


# --- fixtures ----------------------------------------------------------------------

class Deployed:
    def __init__(self, kind_clusters, before: dict[str, set[str]]):
        self.kind = kind_clusters
        self.before = before
        self.shipped = Shipped.read()

    def api(self, name: str):
        return api_client(self.kind.kubeconfig(name))


# A team's own objects, there before the product and left alone by it: a TrainJob that is
# not the product's to run (on the manager it names upstream Trainer's controller, on a
# worker the multicluster one) and a Secret.
USER_NAMESPACE = "user-team"


def keep_users_objects(api, manager: bool) -> None:
    fixtures.ensure_namespace(api, USER_NAMESPACE)
    job = trainjob("kept", USER_NAMESPACE, managed_by=(
        c.MANAGED_BY_TRAINER_CONTROLLER if manager else c.MANAGED_BY_MULTIKUEUE))
    for make in (lambda: create(api, job), lambda: client.CoreV1Api(api).create_namespaced_secret(
            USER_NAMESPACE, client.V1Secret(metadata=client.V1ObjectMeta(name="kept"),
                                            string_data={"token": "team's own"}))):
        try:
            make()
        except ApiException as err:
            assert err.status == 409, err.body


@pytest.fixture(scope="module")
def deployed(kind_clusters):
    before = {}
    for name in NAMES:
        with api_client(kind_clusters.kubeconfig(name)) as api:
            keep_users_objects(api, manager=name == "manager")
            before[name] = inventory(api)
    report = deploy(kind_clusters, timeout=480)
    print("deployed:", report.steps, f"{report.seconds:.0f} s")
    for name in WORKERS:
        with api_client(kind_clusters.kubeconfig(name)) as api:
            fixtures.install_runtime(api, workload_runtime())
    return Deployed(kind_clusters, before)


@pytest.fixture
def manager(deployed):
    with deployed.api("manager") as api:
        yield api


def job_namespace(deployed) -> str:
    """A new namespace on each of ``deployed``'s clusters, opened to the dispatcher on the
    workers (as their administrator would); its name."""
    name = f"kind-{secrets.token_hex(3)}"
    for cluster in NAMES:
        with deployed.api(cluster) as api:
            fixtures.ensure_namespace(api, name)
            if cluster != "manager":  # the worker's administrator opens it to the dispatcher
                fixtures.open_namespace_to_dispatcher(api, name)
    return name


@pytest.fixture
def namespace(deployed, manager):
    """A namespace on every cluster (a job's namespace must exist on its worker, opened to
    the dispatcher by a RoleBinding of trainjob-dispatcher-writer there). At the
    end the manager's TrainJobs are deleted while the dispatcher runs, so its finalizers
    are cleared and the copies go, and then the namespaces."""
    name = job_namespace(deployed)
    yield name
    objects(manager).delete_collection_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, name, c.TRAINJOBS)
    eventually(lambda: trainjob_names(manager, name), lambda left: not left,
               expected=f"every TrainJob of {name} gone from the manager", timeout=120)
    for cluster in NAMES:
        with deployed.api(cluster) as api:
            client.CoreV1Api(api).delete_namespace(name)


# --- tests -------------------------------------------------------------------------

def test_deployed_from_the_shipped_manifests(deployed, manager):
    """Two dispatcher replicas and a leader on the manager; on each worker two operator
    replicas, the webhook's certificate and the worker registered Active."""
    shipped = deployed.shipped
    pods = client.CoreV1Api(manager).list_namespaced_pod(shipped.dispatcher_namespace).items
    assert sorted(p.status.phase for p in pods) == ["Running", "Running"], [
        (p.metadata.name, p.status.phase) for p in pods]
    assert {p.spec.containers[0].image for p in pods} == {images.DISPATCHER_IMAGE}
    lease = client.CoordinationV1Api(manager).read_namespaced_lease(
        shipped.dispatcher_lease, shipped.dispatcher_namespace)
    assert any(lease.spec.holder_identity.startswith(p.metadata.name) for p in pods), (
        lease.spec.holder_identity)
    for worker in WORKERS:
        cluster = objects(manager).get_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, worker)
        assert conditions(cluster)["Active"]["status"] == "True", cluster.get("status")
        with deployed.api(worker) as api:
            operators = client.CoreV1Api(api).list_namespaced_pod(
                shipped.operator_namespace).items
            assert [p.status.phase for p in operators] == ["Running", "Running"]
            assert waits.deployment_problem(api, shipped.operator_namespace,
                                            shipped.operator_deployment) is None


def test_jobs_run_as_real_containers_and_finish_on_the_manager(deployed, manager, namespace):
    create(manager, trainjob("completes", namespace, "--run-for", "6s"))
    create(manager, trainjob("fails", namespace, "--run-for", "1s", "--exit-code", "1"))
    # The dispatcher removes a finished job's copy (and with it the pods), so the container
    # is looked at while it runs: its image and what it printed on starting.
    ran: dict[str, str] = {}

    def observe() -> dict:
        job = get(manager, namespace, "completes")
        worker = worker_of(job)
        if worker and not ran:
            with deployed.api(worker) as api:
                for pod in trainer_pods(api, namespace, "completes"):
                    statuses = pod.status.container_statuses or []
                    if statuses and statuses[0].state.running:
                        ran["image"] = statuses[0].image
                        ran["log"] = client.CoreV1Api(api).read_namespaced_pod_log(
                            pod.metadata.name, namespace)
        return job

    eventually(observe, lambda job: is_true(job, c.CONDITION_COMPLETE),
               expected="TrainJob completes Complete=True on the manager", timeout=180,
               interval=0.5)
    assert ran, "the container of completes was never seen running"
    assert ran["image"].endswith(images.WORKLOAD_IMAGE), ran
    assert "running for 6s, then exiting 0" in ran["log"], ran["log"]

    failed = eventually(lambda: get(manager, namespace, "fails"),
                        lambda job: is_true(job, c.CONDITION_FAILED),
                        expected="TrainJob fails Failed=True on the manager", timeout=180)
    assert not is_true(failed, c.CONDITION_COMPLETE)
    # The worker's reason, from its JobSet: a Job failed (the container's exit 1, no retry).
    shown = conditions(failed)[c.CONDITION_FAILED]
    assert shown["reason"] == "FailedJobs", shown
    assert shown["message"].startswith("jobset failed due to one or more job failures"), shown
    assert "fails-node-0" in shown["message"], shown


def test_a_job_too_large_waits_with_a_reason_and_runs_once_room_appears(
        deployed, manager, namespace):
    # One long job on each worker takes more than half of its Node's cpu.
    for index in (1, 2):
        create(manager, trainjob(f"hold-{index}", namespace, "--run-for", "600s",
                                 cpu=LARGE_CPU))
    holds = eventually(
        lambda: {n: worker_of(get(manager, namespace, n)) for n in ("hold-1", "hold-2")},
        lambda placed: set(placed.values()) == set(WORKERS),
        expected="hold-1 and hold-2 placed, one on each worker", timeout=120)

    create(manager, trainjob("large", namespace, "--run-for", "1s", cpu=LARGE_CPU))
    waiting = eventually(
        lambda: conditions(get(manager, namespace, "large")).get(c.CONDITION_PLACED, {}),
        lambda placed: placed.get("reason") == c.REASON_NO_WORKER,
        expected=f"TrainJob large Placed=False {c.REASON_NO_WORKER}", timeout=60)
    assert waiting["status"] == "False"
    assert "cpu" in waiting["message"] and all(w in waiting["message"] for w in WORKERS), (
        waiting["message"])
    assert worker_of(get(manager, namespace, "large")) is None

    # Room appears: hold-1 is deleted, and its copy and pods go with it.
    objects(manager).delete_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, "hold-1")
    done = eventually(lambda: get(manager, namespace, "large"),
                      lambda job: is_true(job, c.CONDITION_COMPLETE),
                      expected="TrainJob large Complete=True once hold-1 is gone", timeout=180)
    assert worker_of(done) == holds["hold-1"]


def cordon(core: client.CoreV1Api, nodes: list[str], unschedulable: bool) -> None:
    for node in nodes:
        core.patch_node(node, {"spec": {"unschedulable": unschedulable}})


def test_the_standby_dispatcher_takes_over_and_no_job_gets_a_second_copy(
        deployed, manager, namespace):
    shipped = deployed.shipped
    coordination = client.CoordinationV1Api(manager)

    def holder() -> str:
        return coordination.read_namespaced_lease(
            shipped.dispatcher_lease, shipped.dispatcher_namespace).spec.holder_identity or ""

    core = client.CoreV1Api(manager)
    pods = {p.metadata.name for p in core.list_namespaced_pod(
        shipped.dispatcher_namespace).items}
    leader = next(p for p in pods if holder().startswith(p))
    # The Deployment replaces the deleted Pod at once, and its replacement, once started,
    # competes for the released Lease with the replica already standing by; either may win.
    # The manager's nodes are cordoned until the Lease has moved, so the replacement stays
    # Pending and the standby is the one candidate.
    nodes = [n.metadata.name for n in core.list_node().items]
    cordon(core, nodes, True)
    try:
        core.delete_namespaced_pod(leader, shipped.dispatcher_namespace)
        # Jobs submitted while the deleted Pod is going away (it leads until its SIGTERM
        # arrives, and may dispatch them itself), then jobs submitted once it has given the
        # Lease up, which only the standby can dispatch.
        during = [f"during-failover-{i}" for i in range(3)]
        for name in during:
            create(manager, trainjob(name, namespace, "--run-for", "1s"))
        first = eventually(holder, lambda held: bool(held) and not held.startswith(leader),
                           timeout=90, interval=0.2,
                           expected=f"another Pod than the deleted {leader} holding the Lease")
    finally:
        cordon(core, nodes, False)
    standby = sorted(pods - {leader})
    assert any(first.startswith(p) for p in standby), (
        f"the Lease went to {first!r}, not to the standby of {standby}")
    # Who holds the Lease from then on, in order: on a machine this busy, a leader that
    # misses its renew deadline hands over again, which must not duplicate a job either.
    holders = [first]
    after = [f"after-failover-{i}" for i in range(3)]
    for name in after:
        create(manager, trainjob(name, namespace, "--run-for", "1s"))
    names = during + after

    seen: dict[str, set[str]] = {name: set() for name in names}
    apis = {w: deployed.api(w) for w in WORKERS}
    try:
        def observe() -> list[str]:
            if (held := holder()) and held != holders[-1]:
                holders.append(held)
            for worker, api in apis.items():
                for name in trainjob_names(api, namespace):
                    seen[name].add(worker)
            return [n for n in names
                    if not is_true(get(manager, namespace, n), c.CONDITION_COMPLETE)]

        eventually(observe, lambda unfinished: not unfinished,
                   expected="every job submitted during the failover Complete", timeout=240,
                   interval=0.5)
    finally:
        for api in apis.values():
            api.close()
    assert {n: len(w) for n, w in seen.items()} == dict.fromkeys(names, 1), (
        f"expected each job on one worker; saw {seen} (Lease holders in turn: {holders})")
    assert not any(h.startswith(leader) for h in holders), (
        f"the deleted Pod {leader} held the Lease again: {holders}")


def tls_crt(core: client.CoreV1Api, shipped: Shipped) -> str:
    """The serving certificate the operator keeps in its Secret ("" before it has one)."""
    try:
        secret = core.read_namespaced_secret(WEBHOOK_SECRET, shipped.operator_namespace)
    except ApiException as err:
        if err.status == 404:
            return ""
        raise
    return (secret.data or {}).get("tls.crt", "")


def test_the_operators_own_certificate_admits_and_refuses(deployed, namespace):
    """manifests/worker alone (no certificate made by anyone else): the operator made its
    Secret and put its CA into the webhook configuration, so the apiserver calls it."""
    with deployed.api("worker-1") as worker:
        assert tls_crt(client.CoreV1Api(worker), deployed.shipped)
        create(worker, trainjob("valid", namespace, managed_by=None, suspend=True))
        with pytest.raises(ApiException) as refused:
            create(worker, trainjob("1-not-a-dns-label", namespace, managed_by=None))
        assert refused.value.status == 422 and "denied the request" in refused.value.body, (
            refused.value.body)
        assert "metadata.name" in refused.value.body, refused.value.body


def test_an_operator_rollout_and_certificate_rotations_refuse_no_trainjob_create(
        deployed, manager, namespace):
    """The operator rolled out with serving certificates of 30 s (renewed every 20 s), while
    TrainJobs are created: none is refused, through the rollout and two rotations."""
    shipped = deployed.shipped
    with deployed.api("worker-1") as worker:
        core, apps = client.CoreV1Api(worker), client.AppsV1Api(worker)
        before = {p.metadata.name for p in core.list_namespaced_pod(
            shipped.operator_namespace).items}
        # A new template, so every Pod is replaced: the same arguments and a shorter
        # certificate validity (the leader renews the Secret's at once, as too long-lived).
        deployment = apps.read_namespaced_deployment(shipped.operator_deployment,
                                                     shipped.operator_namespace)
        container = deployment.spec.template.spec.containers[0]
        apps.patch_namespaced_deployment(shipped.operator_deployment,
                                         shipped.operator_namespace, {
            "spec": {"template": {
                "metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt":
                        datetime.datetime.now(datetime.UTC).isoformat()}},
                "spec": {"containers": [{"name": container.name, "args": [
                    *container.args, f"--webhook-cert-validity={SHORT_VALIDITY}"]}]}}}})
        certificates = [tls_crt(core, shipped)]
        created, refused = [], []
        via_manager = []
        deadline = time.monotonic() + 240
        index = 0
        # Creates on the worker itself (as a copy's create is), and through the dispatcher,
        # until the rollout is over.
        while True:
            name = f"during-rollout-{index}"
            try:
                create(worker, trainjob(name, namespace, managed_by=None, suspend=True))
                created.append(name)
            except ApiException as err:
                refused.append(f"{name}: {err.status} {(err.body or '')[:1000]}")
            if index % 5 == 0:
                create(manager, trainjob(f"rollout-{index}", namespace, "--run-for", "1s"))
                via_manager.append(f"rollout-{index}")
            index += 1
            now = {p.metadata.name for p in core.list_namespaced_pod(
                shipped.operator_namespace).items}
            current = tls_crt(core, shipped)
            if current != certificates[-1]:
                certificates.append(current)
            rolled_out = (waits.deployment_problem(worker, shipped.operator_namespace,
                                                   shipped.operator_deployment) is None
                          and not now & before)
            # The first change is the renewal the shorter validity calls for; two more are
            # rotations on their schedule.
            over = rolled_out and len(certificates) >= 4
            if over or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # pacing of the creates, not a wait for anything
        assert over, (f"within 240 s: rolled out {rolled_out} (pods {now}, before {before}); "
                      f"{len(certificates) - 1} certificate changes, expected 3")
        assert refused == [], f"{len(refused)} of {index} creates refused: {refused[:3]}"
        assert len(created) >= 10, f"only {len(created)} creates during the rollout"
    for name in via_manager:
        eventually(lambda name=name: get(manager, namespace, name),
                   lambda job: is_true(job, c.CONDITION_COMPLETE),
                   expected=f"TrainJob {name}, submitted during the rollout, Complete",
                   timeout=180)


def test_kubectl_delete_k_removes_what_was_deployed_and_nothing_else(deployed):
    """Last in the module. The TrainJobs are gone already (each test's namespace fixture
    deleted them while the dispatcher ran)."""
    results: dict[str, object] = {}

    def delete(cluster: str, base: str) -> None:
        results[cluster] = kustomize.kubectl(
            deployed.kind.kubeconfig(cluster), "delete", "-k", str(kustomize.base_path(base)),
            # A namespace's objects go with it, before kubectl reaches them: not found is
            # what they should be.
            "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=240)

    threads = [threading.Thread(target=delete, args=(n, MANAGER_BASE if n == "manager"
                                                     else WORKER_BASE)) for n in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for cluster, result in results.items():
        assert result.returncode == 0, f"{cluster}: {result.stderr}"

    for cluster in NAMES:
        installed = rendered_keys(MANAGER_BASE if cluster == "manager" else WORKER_BASE)
        with deployed.api(cluster) as api:
            after = {k for k in inventory(api) if not is_test_namespace(k)}
        before = {k for k in deployed.before[cluster] if not is_test_namespace(k)}
        assert after & installed == set(), f"{cluster}: left behind: {after & installed}"
        assert before - installed <= after, (
            f"{cluster}: removed though not deployed: {(before - installed) - after}")
        assert after - before == set(), f"{cluster}: new and left: {after - before}"
