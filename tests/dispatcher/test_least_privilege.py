"""The shipped RBAC, exercised as shipped: the dispatcher and the operators run with
credentials bound only to the roles in manifests/ (dispatcher with the worker-secrets
component, as manifests/manager has it; operator; worker-access), rendered by kustomize and
applied to the real apiservers. The worker-secrets Role gets this module's worker Secret
names, as its comment tells users to.

Each process authenticates with a client certificate whose CN is
``system:serviceaccount:<ns>:<name>`` (issued by the cluster's CA), which RBAC matches to
the ServiceAccount subjects of the shipped bindings. The dispatcher's kubeconfig for a
worker, stored in the MultiKueueCluster Secret, is the worker-access ServiceAccount's.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kustomize, worker_stack
from clusters.pki import service_account_user
from clusters.testing import ServiceProcess, eventually
from controller_kit.kubeclient import api_client
from trainjob import constants as c

TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
RUNTIME = "torch-least-privilege"
CONFIG = "least-privilege"
WORKERS = ("worker-1", "worker-2")
# Only these kinds are applied for real: the Deployments would never run here (no
# scheduler, no kubelet) and the operator's fail-closed webhook would block every TrainJob
# write on the worker for the rest of the session. The worker-access policy, which looks
# only at the dispatcher's own requests, is applied with its Pod Security level (a
# ConfigMap): the path runs under it.
IDENTITY_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                  "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "ConfigMap"}
# The dispatcher's own namespace, as manifests/dispatcher creates it: its Lease and the
# worker kubeconfig Secrets (standalone mode).
DISPATCHER_NAMESPACE = "trainjob-system"
DISPATCHER_SA = (DISPATCHER_NAMESPACE, "trainjob-dispatcher")
WORKER_ACCESS_SA = ("trainjob-system", "trainjob-dispatcher")
OPERATOR_SA = ("training-operator-system", "training-operator")


def identity_objects(base: str | os.PathLike) -> list[dict]:
    """The identity objects of ``manifests/<base>``, or of the kustomization in a directory."""
    if isinstance(base, str):
        objects = kustomize.render(base)
    else:
        out = kustomize.kubectl(None, "kustomize", str(base))
        assert out.returncode == 0, out.stderr
        objects = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    return [obj for obj in objects if obj["kind"] in IDENTITY_KINDS]


def dispatcher_with_worker_secrets(directory) -> os.PathLike:
    """The dispatcher base with the worker-secrets component, as the manager overlays have
    it (without the CRDs, which the session's clusters have already)."""
    directory.mkdir(exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(kustomize.base_path("dispatcher"), directory)],
        "components": [os.path.relpath(kustomize.base_path("worker-secrets"), directory)]}))
    return directory


def with_secret_names(objects: list[dict], names: list[str]) -> list[dict]:
    """The dispatcher's identities with ``names`` added to the Secrets it may read, as
    manifests/worker-secrets tells users to do for their own MultiKueueClusters."""
    rules = [rule for obj in objects if obj["kind"] == "Role"
             for rule in obj["rules"] if rule["resources"] == ["secrets"]]
    assert len(rules) == 1 and rules[0].get("resourceNames"), (
        f"expected one Secrets rule limited by resourceNames in the dispatcher's Roles; saw "
        f"{rules}")
    rules[0]["resourceNames"] += names
    return objects


def subjects(objects: list[dict]) -> set[tuple[str, str]]:
    return {(s["namespace"], s["name"]) for obj in objects
            if obj["kind"] in ("RoleBinding", "ClusterRoleBinding")
            for s in obj["subjects"] if s["kind"] == "ServiceAccount"}


# Left for the rest of the session as well as the namespaces: the worker-access policy, its
# bindings and its level. Deleted and applied again at once by the next module, the
# binding that reads the level was seen to keep holding copies to baseline whatever the
# ConfigMap said next (kube-apiserver v1.34.4): the policy looks only at the dispatcher's
# own requests, and the next module applies the same objects.
KEPT_KINDS = {"Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
              "ConfigMap"}


def delete_identities(kubeconfig, objects: list[dict]) -> None:
    # Namespaces stay: a later module applying into one still being deleted would fail.
    doomed = [o for o in objects if o["kind"] not in KEPT_KINDS]
    kustomize.kubectl(kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                      stdin=yaml.safe_dump_all(doomed))


def issue(multicluster, cluster: str, account: tuple[str, str], path) -> object:
    user, groups = service_account_user(*account)
    return multicluster.harness.issue_user_kubeconfig(cluster, user, groups, path)


def forbidden(call) -> ApiException:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, (
        f"expected 403 Forbidden; got {err.value.status}: {err.value.body}")
    return err.value


def get(cluster_api, namespace: str, name: str, plural: str = c.TRAINJOBS, gv=TRAINER):
    try:
        return client.CustomObjectsApi(cluster_api).get_namespaced_custom_object(
            *gv, namespace, plural, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def condition(obj: dict | None, type_: str) -> dict:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return item
    return {}


def trainjob(name: str) -> dict:
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"managedBy": c.MANAGED_BY_MULTIKUEUE, "runtimeRef": {"name": RUNTIME},
                     "trainer": {"numNodes": 2,
                                 "resourcesPerNode": {"requests": {"cpu": "500m"}}}}}


def event_reasons(api, namespace: str, name: str) -> set[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}")
    return {e.reason for e in events.items}


@pytest.fixture(scope="module")
def restricted(multicluster, tmp_path_factory):
    """Shipped identities applied; dispatcher and operators running as them."""
    directory = tmp_path_factory.mktemp("least-privilege")
    manager = multicluster.manager
    applied = {"manager": with_secret_names(
        identity_objects(dispatcher_with_worker_secrets(directory / "manager-overlay")),
        [f"lp-{n}-kubeconfig" for n in WORKERS])}
    worker_objects = (identity_objects("worker-namespace") + identity_objects("worker-access")
                      + identity_objects("operator"))
    assert DISPATCHER_SA in subjects(applied["manager"])
    assert {WORKER_ACCESS_SA, OPERATOR_SA} <= subjects(worker_objects)
    kustomize.apply(manager.kubeconfig, applied["manager"])
    for name in WORKERS:
        applied[name] = worker_objects
        kustomize.apply(multicluster[name].kubeconfig, worker_objects)

    kubeconfigs = {"dispatcher": issue(multicluster, "manager", DISPATCHER_SA,
                                       directory / "dispatcher.kubeconfig")}
    for name in WORKERS:
        worker = multicluster[name]
        kubeconfigs[f"{name}/access"] = issue(multicluster, name, WORKER_ACCESS_SA,
                                              directory / f"{name}-access.kubeconfig")
        kubeconfigs[f"{name}/operator"] = issue(multicluster, name, OPERATOR_SA,
                                                directory / f"{name}-operator.kubeconfig")
        fixtures.add_node(worker.api, f"lp-{name}", {"cpu": "8", "memory": "64Gi", "pods": "110"})
        # Its pods run until deleted (kwok), so a job finishes only when a test says so.
        fixtures.install_runtime(worker.api, fixtures.torch_runtime(
            RUNTIME, cpu="100m", memory="128Mi",
            pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER}))
        fixtures.register_worker(manager.api, f"lp-{name}", kubeconfigs[f"{name}/access"],
                                 namespace=DISPATCHER_NAMESPACE)
    fixtures.register_config(manager.api, CONFIG, [f"lp-{n}" for n in WORKERS])

    processes = [ServiceProcess("training_operator", kubeconfigs[f"{n}/operator"],
                                directory / f"operator-{n}.log", ()).start() for n in WORKERS]
    processes.append(ServiceProcess(
        "dispatcher", kubeconfigs["dispatcher"], directory / "dispatcher.log",
        ("--namespace", DISPATCHER_NAMESPACE,
         "--multikueue-config", CONFIG, "--gc-interval", "2", "--leader-elect",
         "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5",
         "--log-level", "debug"),
        # Started again after a lost Lease, as its Deployment would (a short Lease).
        supervised=True).start())
    apis = {key: api_client(path) for key, path in kubeconfigs.items()}
    yield multicluster, apis, processes

    def ours() -> list[str]:
        jobs = client.CustomObjectsApi(manager.api).list_cluster_custom_object(
            *TRAINER, c.TRAINJOBS)["items"]
        return [f"{j['metadata']['namespace']}/{j['metadata']['name']}" for j in jobs
                if (j["metadata"].get("annotations") or {}).get(
                    c.PLACEMENT_ANNOTATION, "").startswith("lp-")]

    # Our jobs go with their test namespaces; their finalizers need this dispatcher, so it
    # stays until they are gone and no later test inherits them.
    eventually(ours, lambda left: not left, timeout=60,
               expected="every job placed by this module's dispatcher deleted")
    for process in processes:
        process.stop()
    for api in apis.values():
        api.close()
    custom = client.CustomObjectsApi(manager.api)
    for name in WORKERS:
        custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                            c.MULTIKUEUECLUSTERS, f"lp-{name}")
        client.CoreV1Api(multicluster[name].api).delete_node(f"lp-{name}")
    custom.delete_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECONFIGS,
                                        CONFIG)
    for name, objects in applied.items():
        delete_identities(multicluster[name].kubeconfig, objects)


def test_full_path_with_only_the_shipped_roles(restricted, namespace):
    multicluster, apis, processes = restricted
    manager = multicluster.manager
    mk = client.CustomObjectsApi(manager.api)
    # Each worker's administrator opens the namespace to the dispatcher (its writes).
    for name in WORKERS:
        fixtures.open_namespace_to_dispatcher(multicluster[name].api, namespace)

    # The Active condition is written with the dispatcher's identity (status patch).
    for name in WORKERS:
        eventually(lambda: mk.get_cluster_custom_object(
                       c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, f"lp-{name}"),
                   lambda obj: condition(obj, "Active").get("status") == "True",
                   expected=f"MultiKueueCluster lp-{name} Active=True through the worker-access "
                   "identity", timeout=60)

    jobs = {}
    for name in ("done", "cancelled"):
        manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                       trainjob(name))
        placed = eventually(
            lambda: get(manager.api, namespace, name),
            lambda obj: bool(obj and (obj["metadata"].get("annotations") or {}).get(
                c.PLACEMENT_ANNOTATION)),
            expected=f"{namespace}/{name} placed on a worker", timeout=60)
        worker = placed["metadata"]["annotations"][c.PLACEMENT_ANNOTATION].removeprefix("lp-")
        jobs[name] = multicluster[worker]
        remote = eventually(lambda: get(jobs[name].api, namespace, name), lambda obj: obj,
                            expected=f"the copy of {namespace}/{name} on {worker}")
        assert remote["metadata"]["labels"][c.MULTIKUEUE_ORIGIN_LABEL] == c.DEFAULT_ORIGIN
        eventually(lambda: get(jobs[name].api, namespace, name, c.JOBSETS, JOBSET),
                   lambda obj: obj,
                   expected=f"the operator on {worker} (own identity) to apply JobSet "
                   f"{namespace}/{name}")
        eventually(lambda: get(manager.api, namespace, name),
                   lambda obj: condition(obj, "Created").get("status") == "True",
                   expected=f"the copy's Created condition mirrored onto {namespace}/{name}")

    # Events are written with both identities (a 403 there would only be logged).
    eventually(lambda: event_reasons(manager.api, namespace, "done"),
               lambda reasons: "Placed" in reasons,
               expected="the dispatcher's Placed Event on the manager TrainJob")
    eventually(lambda: event_reasons(jobs["done"].api, namespace, "done"),
               lambda reasons: bool(reasons),
               expected="the operator's Events on the worker's copy")

    # Completion flows back; the finished copy is removed (retention 0) and so its JobSet.
    done = jobs["done"]
    done.custom.patch_namespaced_custom_object_status(
        *JOBSET, namespace, c.JOBSETS, "done", {"status": {"conditions": [{
            "type": "Completed", "status": "True", "reason": "AllJobsCompleted",
            "message": "written by the test (the pods run until deleted)",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}},
        _content_type="application/merge-patch+json")
    eventually(lambda: get(manager.api, namespace, "done"),
               lambda obj: condition(obj, "Complete").get("status") == "True",
               expected="Complete mirrored onto the manager TrainJob")
    eventually(lambda: get(done.api, namespace, "done"), lambda obj: obj is None,
               expected="the finished copy deleted by the dispatcher's worker identity")

    # Deleting a running job removes its copy and JobSet before the finalizer goes.
    manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "cancelled")
    cancelled = jobs["cancelled"]
    eventually(lambda: (get(manager.api, namespace, "cancelled"),
                        get(cancelled.api, namespace, "cancelled"),
                        get(cancelled.api, namespace, "cancelled", c.JOBSETS, JOBSET)),
               lambda seen: seen == (None, None, None),
               expected="manager job, its copy and the copy's JobSet all gone", timeout=60)

    # RBAC's refusals read 'User "..." cannot <verb> resource ...'. (Other 403s, such as a
    # create in a namespace another test is deleting, are not about permissions.)
    for process in processes:
        refused = [line for line in process.log_file.read_text(errors="replace").splitlines()
                   if "forbidden" in line.lower() and '" cannot ' in line]
        assert not refused, (
            f"{process.module} ({process.kubeconfig.name}) was refused by RBAC:\n"
            + "\n".join(refused[:10]))


def rejections(api, namespace: str, name: str) -> dict[str, str]:
    """Worker -> the message of the dispatcher's RemoteRejected Events on a manager job."""
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}")
    return {e.message.split(":", 1)[0].removeprefix("worker "): e.message
            for e in events.items if e.reason == "RemoteRejected"}


def refused_by_every_worker(multicluster, namespace: str, name: str) -> tuple[dict, dict]:
    """Wait until every worker refused manager job ``name``'s copy: a RemoteRejected Event
    from each and Placed=False naming both; no copy anywhere. The Events' messages by
    worker and the Placed condition, for the caller's own checks."""
    manager = multicluster.manager
    seen = eventually(lambda: rejections(manager.api, namespace, name),
                      lambda found: {f"lp-{n}" for n in WORKERS} <= set(found), timeout=60,
                      expected="a RemoteRejected Event from each worker")
    placed = eventually(lambda: condition(get(manager.api, namespace, name), "Placed"),
                        lambda found: found.get("status") == "False" and all(
                            f"lp-{n}" in found.get("message", "") for n in WORKERS),
                        timeout=60, expected="Placed=False naming both workers' refusals")
    assert all(get(multicluster[n].api, namespace, name) is None for n in WORKERS)
    return seen, placed


def test_workers_refuse_a_copy_that_chooses_its_service_account(restricted, namespace):
    """Each worker's policy refuses the dispatcher's copy of a job that sets its Pods'
    ServiceAccount, and the manager job's Events say so; no copy is made anywhere."""
    multicluster, _, _ = restricted
    manager = multicluster.manager
    for name in WORKERS:
        fixtures.open_namespace_to_dispatcher(multicluster[name].api, namespace)
    body = trainjob("chooses-account")
    body["spec"]["podSpecOverrides"] = [{"targetJobs": [{"name": c.NODE}],
                                         "serviceAccountName": "powerful"}]
    manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, body)
    seen, _ = refused_by_every_worker(multicluster, namespace, "chooses-account")
    for message in seen.values():
        assert "ValidatingAdmissionPolicy 'trainjob-dispatcher-worker-access'" in message and (
            f"spec.podSpecOverrides[targetJobs: {c.NODE}].serviceAccountName is set") in message, (
            message)


def test_workers_refuse_a_privileged_copy(restricted, namespace):
    """A manager user's job whose runtime patch makes its containers privileged: each
    worker's policy refuses the copy, naming the field and Pod Security's reason; the manager
    job's Events and its Placed condition say so, and no copy is made anywhere."""
    multicluster, _, _ = restricted
    manager = multicluster.manager
    for name in WORKERS:
        fixtures.open_namespace_to_dispatcher(multicluster[name].api, namespace)
    body = trainjob("privileged")
    body["spec"]["runtimePatches"] = [{
        "manager": "example.com/user", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": c.NODE, "template": {"spec": {"template": {"spec": {
                "containers": [{"name": c.NODE, "securityContext": {"privileged": True}}]}}}}}]}}}}]
    manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, body)
    field = ("spec.runtimePatches[manager: example.com/user].trainingRuntimeSpec.template.spec"
             f".replicatedJobs[name: {c.NODE}].template.spec.template.spec"
             f".containers[name: {c.NODE}].securityContext.privileged: Pod Security baseline "
             "forbids privileged containers")
    seen, placed = refused_by_every_worker(multicluster, namespace, "privileged")
    for message in seen.values():
        assert "ValidatingAdmissionPolicy 'trainjob-dispatcher-worker-access'" in message, message
        assert f"TrainJob {namespace}/privileged: {field}" in message, message
    assert field in placed["message"], placed


def test_workers_refuse_an_oversized_copy(restricted, namespace):
    """A job past the worker policy's bounds (33 pod templates patched, over its 32): each
    worker refuses the copy naming the list and the limit, not with the apiserver's CEL
    cost error, and the manager job's Events and Placed condition say so."""
    multicluster, _, _ = restricted
    manager = multicluster.manager
    for name in WORKERS:
        fixtures.open_namespace_to_dispatcher(multicluster[name].api, namespace)
    body = trainjob("oversized")
    body["spec"]["runtimePatches"] = [{
        "manager": f"example.com/team-{team}", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": f"job-{i}", "template": {"spec": {"template": {
                "metadata": {"labels": {"team": team}}}}}} for i in range(count)]}}}}
        for team, count in (("a", 17), ("b", 16))]
    manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, body)
    bound = ("spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs: 33 "
             "replicated jobs in all, over the limit of 32")
    seen, placed = refused_by_every_worker(multicluster, namespace, "oversized")
    for message in seen.values():
        assert f"TrainJob {namespace}/oversized: {bound}" in message, message
    assert bound in placed["message"], placed


def test_workers_refuse_a_namespace_without_pod_security(restricted, namespace):
    """Opened by RBAC but enforcing no Pod Security level: each worker refuses the copy,
    naming the namespace, the label and the level it needs."""
    multicluster, _, _ = restricted
    manager = multicluster.manager
    for name in WORKERS:
        fixtures.open_namespace_to_dispatcher(multicluster[name].api, namespace,
                                              pod_security=None)
    manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                   trainjob("unlabelled"))
    seen, _ = refused_by_every_worker(multicluster, namespace, "unlabelled")
    for message in seen.values():
        assert (f"namespace {namespace} has no label pod-security.kubernetes.io/enforce") in (
            message) and "pod-security.kubernetes.io/enforce=baseline" in message, message


def test_workers_refuse_a_namespace_not_opened_to_the_dispatcher(restricted, namespace):
    """No RoleBinding of trainjob-dispatcher-writer in the job's namespace on the workers:
    RBAC refuses the copy, and the manager job's Events name the namespace."""
    multicluster, _, _ = restricted
    manager = multicluster.manager
    manager.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                   trainjob("not-opened"))
    seen, _ = refused_by_every_worker(multicluster, namespace, "not-opened")
    for message in seen.values():
        assert 'cannot create resource "trainjobs"' in message and (
            f'in the namespace "{namespace}"') in message, message


def test_identities_are_refused_what_they_do_not_need(restricted, namespace):
    multicluster, apis, _ = restricted
    body = client.V1Secret(metadata=client.V1ObjectMeta(name="private"),
                           string_data={"token": "not for the dispatcher"})
    for cluster in multicluster:
        cluster.core.create_namespaced_secret(namespace, body)

    unnamed = client.V1Secret(metadata=client.V1ObjectMeta(name=f"unnamed-{namespace}"[:63]),
                              string_data={"token": "no MultiKueueCluster names this"})
    multicluster.manager.core.create_namespaced_secret(DISPATCHER_NAMESPACE, unnamed)

    dispatcher = client.CoreV1Api(apis["dispatcher"])
    try:
        # The Secrets the MultiKueueClusters name are readable, by name (a list/watch with
        # a metadata.name field selector)...
        for name in WORKERS:
            assert dispatcher.list_namespaced_secret(
                DISPATCHER_NAMESPACE, field_selector=f"metadata.name=lp-{name}-kubeconfig").items
        # ...no other of its own namespace, nor the namespace as a list...
        forbidden(lambda: dispatcher.list_namespaced_secret(DISPATCHER_NAMESPACE))
        forbidden(lambda: dispatcher.list_namespaced_secret(
            DISPATCHER_NAMESPACE, field_selector=f"metadata.name={unnamed.metadata.name}"))
        forbidden(lambda: dispatcher.read_namespaced_secret(unnamed.metadata.name,
                                                            DISPATCHER_NAMESPACE))
        forbidden(lambda: dispatcher.read_namespaced_secret("lp-worker-1-kubeconfig",
                                                            DISPATCHER_NAMESPACE))  # list only
    finally:
        multicluster.manager.core.delete_namespaced_secret(unnamed.metadata.name,
                                                           DISPATCHER_NAMESPACE)
    # ...and any other namespace's are not, neither one by one nor as a list.
    forbidden(lambda: dispatcher.read_namespaced_secret("private", namespace))
    forbidden(lambda: dispatcher.list_namespaced_secret(namespace))
    forbidden(lambda: dispatcher.list_secret_for_all_namespaces())
    forbidden(lambda: client.CustomObjectsApi(apis["dispatcher"]).delete_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "anything"))

    for name in WORKERS:
        access = client.CoreV1Api(apis[f"{name}/access"])
        assert access.list_node().items  # placement reads Nodes...
        forbidden(lambda: access.delete_node(f"lp-{name}"))  # ...and may not remove them
        forbidden(lambda: access.read_namespaced_secret("private", namespace))
        forbidden(lambda: access.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        forbidden(lambda: client.CustomObjectsApi(apis[f"{name}/access"])
                  .patch_namespaced_custom_object_status(
                      *TRAINER, namespace, c.TRAINJOBS, "anything", {"status": {}},
                      _content_type="application/merge-patch+json"))

        operator = client.CoreV1Api(apis[f"{name}/operator"])
        forbidden(lambda: operator.read_namespaced_secret("private", namespace))
        forbidden(lambda: operator.list_namespaced_secret(namespace))
        forbidden(lambda: operator.delete_namespaced_secret("private", namespace))
        forbidden(lambda: operator.delete_node(f"lp-{name}"))
        forbidden(lambda: client.CustomObjectsApi(apis[f"{name}/operator"])
                  .delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "anything"))
