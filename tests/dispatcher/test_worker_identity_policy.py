"""The dispatcher's identity on a worker, as manifests/worker-access ships it (RBAC and the
ValidatingAdmissionPolicy), applied to a real worker apiserver and exercised with forged
requests: a client certificate for ``system:serviceaccount:trainjob-system:
trainjob-dispatcher`` from the worker's CA, which is what a leaked kubeconfig of the
manager's would hold. It creates and deletes the copies the dispatcher makes, in the
namespaces opened to it, and nothing else; other users are not affected.
"""

from __future__ import annotations

import copy
import json
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kustomize
from clusters.pki import service_account_user
from clusters.testing import eventually
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone import mirror
from dispatcher.standalone.remote_copies import Created, RemoteCopies, SentDeletes
from trainjob import constants as c
from trainjob.kubeclient import api_client

TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
WORKER = "worker-1"
BASE = "worker-access"
POLICY = "trainjob-dispatcher-worker-access"
# What is applied for real (the token Secret needs a token controller, and is not the
# point here).
APPLIED_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
OPENED = "identity-policy-opened"
CLOSED = "identity-policy-closed"


# --- the manifests -----------------------------------------------------------------

def rendered() -> list[dict]:
    return kustomize.render(BASE)


def named(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def test_the_policy_names_the_shipped_identity_and_denies():
    """The policy looks at the very ServiceAccount the base ships (it names it in a
    matchCondition, which an overlay moving the ServiceAccount would have to follow), is
    bound with Deny, and every validation explains itself."""
    objects = rendered()
    [account] = named(objects, "ServiceAccount")
    identity = (account["metadata"]["namespace"], account["metadata"]["name"])
    assert identity == fixtures.WORKER_ACCESS_ACCOUNT
    [policy] = named(objects, "ValidatingAdmissionPolicy")
    assert "namespace" not in policy["metadata"], "a cluster-scoped object with a namespace"
    username = "system:serviceaccount:{}:{}".format(*identity)
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"].strip() == (
        f"request.userInfo.username == '{username}'"), condition
    assert policy["spec"].get("failurePolicy", "Fail") == "Fail"
    assert all(v.get("messageExpression") and v.get("reason") == "Forbidden"
               for v in policy["spec"]["validations"]), policy["spec"]["validations"]
    [binding] = named(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "paramRef" not in binding["spec"] and "matchResources" not in binding["spec"]


def test_writes_are_granted_only_per_namespace():
    """Reads are bound cluster-wide; the writes (create and delete of TrainJobs, nothing
    more) are a ClusterRole the base never binds: an administrator binds it per namespace."""
    objects = rendered()
    [writer] = named(objects, "ClusterRole", fixtures.WORKER_WRITER_ROLE)
    assert writer["rules"] == [{"apiGroups": [c.TRAINER_GROUP], "resources": [c.TRAINJOBS],
                                "verbs": ["create", "delete"]}]
    bound = {o["roleRef"]["name"] for o in objects if o["kind"].endswith("Binding")
             and "roleRef" in o}
    assert fixtures.WORKER_WRITER_ROLE not in bound, bound
    readers = [o for o in named(objects, "ClusterRole") if o is not writer]
    verbs = {verb for role in readers for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, f"cluster-wide writes: {verbs}"


# --- the policy on a real worker ----------------------------------------------------

def trainjob(name: str, namespace: str = OPENED, labels: dict | None = None,
             annotations: dict | None = None, **spec) -> dict:
    """A TrainJob as the dispatcher writes a copy (origin label and manager UID), with
    ``labels``/``annotations`` replacing those marks when given and ``spec`` added."""
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {c.MULTIKUEUE_ORIGIN_LABEL: c.DEFAULT_ORIGIN}
                         if labels is None else labels,
                         "annotations": {c.MANAGER_UID_ANNOTATION: str(uuid.uuid4())}
                         if annotations is None else annotations},
            "spec": {"runtimeRef": {"name": "torch-policy"}, "suspend": True, **spec}}


def runtime_patch(pod_spec: dict, manager: str = "example.com/team-defaults") -> dict:
    """A v2.3 ``spec.runtimePatches`` entry patching the pod spec of replicated job node."""
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": c.NODE, "template": {"spec": {"template": {
            "spec": pod_spec}}}}]}}}}


def override(**fields) -> dict:
    """A v2.0 ``spec.podSpecOverrides`` entry for replicated job node."""
    return {"targetJobs": [{"name": c.NODE}], **fields}


MERGE_PATCH = "application/merge-patch+json"
HOST_PATH = {"name": "host", "hostPath": {"path": "/", "type": "Directory"}}


def refusal(call) -> str:
    """The message of the 403 ``call`` gets."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, (
        f"expected 403 Forbidden; got {err.value.status}: {err.value.body}")
    return json.loads(err.value.body)["message"]


def by_policy(message: str) -> bool:
    return f"ValidatingAdmissionPolicy '{POLICY}'" in message


def create(api: client.ApiClient, body: dict, **kwargs) -> dict:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        *TRAINER, body["metadata"]["namespace"], c.TRAINJOBS, body, **kwargs)


def delete(api: client.ApiClient, namespace: str, name: str):
    return client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, name)


def get(api: client.ApiClient, namespace: str, name: str) -> dict | None:
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(
            *TRAINER, namespace, c.TRAINJOBS, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


@pytest.fixture(scope="module")
def worker_identity(multicluster, tmp_path_factory):
    """worker-access applied to one worker, OPENED opened to the dispatcher and CLOSED not,
    and an API client authenticating as the dispatcher's identity there."""
    worker = multicluster[WORKER]
    # Its namespace first: manifests/worker-namespace declares it, worker-access lives in it.
    objects = [o for o in kustomize.render("worker-namespace") + rendered()
               if o["kind"] in APPLIED_KINDS]
    kustomize.apply(worker.kubeconfig, objects)
    for name in (OPENED, CLOSED):
        fixtures.ensure_namespace(worker.api, name)
    fixtures.open_namespace_to_dispatcher(worker.api, OPENED)
    user, groups = service_account_user(*fixtures.WORKER_ACCESS_ACCOUNT)
    path = multicluster.harness.issue_user_kubeconfig(
        WORKER, user, groups, tmp_path_factory.mktemp("identity-policy") / "access.kubeconfig")
    api = api_client(path)

    def probe() -> str:
        # Admission runs for a dry run too; the policy answers once its informers have it.
        try:
            create(api, trainjob("probe", labels={}), dry_run="All")
            return "admitted"
        except ApiException as err:
            return err.body or ""

    eventually(probe, lambda body: by_policy(body) and "multikueue-origin] is missing" in body,
               timeout=30,
               expected=f"an unlabelled TrainJob refused by ValidatingAdmissionPolicy {POLICY}")
    yield worker, api
    api.close()
    for name in (OPENED, CLOSED):
        worker.core.delete_namespace(name)
    kustomize.kubectl(worker.kubeconfig, "delete", "--ignore-not-found", "--wait=false",
                      "-f", "-", stdin=yaml.safe_dump_all(
                          [o for o in objects if o["kind"] != "Namespace"]))


def test_a_copy_as_the_dispatcher_makes_it_is_created_and_deleted(worker_identity):
    """The dispatcher's own write path (RemoteCopies) through the policy: a manager job
    with node selectors, tolerations, volumes that are not hostPath and runtime patches of
    every shape (Kueue's, which would set a ServiceAccount, stays behind: build_remote
    leaves it out) is copied, and the copy deleted."""
    worker, api = worker_identity
    manager_job = {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "copied", "namespace": OPENED, "uid": str(uuid.uuid4()),
                     "labels": {"team": "vision"},
                     "annotations": {c.PLACEMENT_ANNOTATION: WORKER}},
        "spec": {
            "managedBy": c.MANAGED_BY_MULTIKUEUE, "runtimeRef": {"name": "torch-policy"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "1"}}},
            "podSpecOverrides": [override(
                nodeSelector={"pool": "gpu"},
                tolerations=[{"key": "gpu", "operator": "Exists"}],
                volumes=[{"name": "scratch", "emptyDir": {}}],
                containers=[{"name": c.NODE, "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"}]}])],
            "runtimePatches": [
                runtime_patch({"volumes": [{"name": "data", "persistentVolumeClaim": {
                    "claimName": "data"}}], "nodeSelector": {"zone": "a"}}),
                {"manager": "example.com/labels-only", "trainingRuntimeSpec": {
                    "template": {"metadata": {"labels": {"cost-centre": "vision"}}}}},
                {"manager": "example.com/nothing-yet"},
                runtime_patch({"serviceAccountName": "kueue-chose-this"},
                              manager=c.KUEUE_RUNTIME_PATCH_MANAGER)]}}
    copies = RemoteCopies(api, WORKER, c.DEFAULT_ORIGIN, DispatcherMetrics(), SentDeletes())
    outcome = copies.create(manager_job, {"cpu": "2"}, 2)
    assert isinstance(outcome, Created) and not outcome.adopted, outcome
    assert mirror.is_ours(outcome.copy, c.DEFAULT_ORIGIN)
    assert copies.delete(outcome.copy) is True
    eventually(lambda: get(worker.api, OPENED, "copied"), lambda obj: obj is None,
               expected=f"TrainJob {OPENED}/copied deleted by the dispatcher's identity")


def test_a_namespace_not_opened_is_refused_by_rbac(worker_identity):
    worker, api = worker_identity
    message = refusal(lambda: create(api, trainjob("elsewhere", CLOSED)))
    assert 'cannot create resource "trainjobs"' in message and f'namespace "{CLOSED}"' in message, (
        message)
    create(worker.api, trainjob("elsewhere", CLOSED))  # the administrator may
    message = refusal(lambda: delete(api, CLOSED, "elsewhere"))
    assert 'cannot delete resource "trainjobs"' in message and f'namespace "{CLOSED}"' in message, (
        message)


def test_an_administrator_sees_which_namespaces_are_open(worker_identity):
    """What ``kubectl auth can-i create trainjobs -n <ns> --as=<the identity>`` asks: yes
    where the writer role is bound, no elsewhere."""
    _, api = worker_identity
    authorization = client.AuthorizationV1Api(api)

    def allowed(namespace: str, verb: str) -> bool:
        review = authorization.create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    group=c.TRAINER_GROUP, resource=c.TRAINJOBS, verb=verb,
                    namespace=namespace))))
        return review.status.allowed

    assert [allowed(OPENED, v) for v in ("create", "delete", "update", "get")] == [
        True, True, False, True]
    assert [allowed(CLOSED, v) for v in ("create", "delete", "update", "get")] == [
        False, False, False, True]


@pytest.mark.parametrize("marks,field", [
    ({"labels": {}}, f"metadata.labels[{c.MULTIKUEUE_ORIGIN_LABEL}]"),
    ({"labels": {c.MULTIKUEUE_ORIGIN_LABEL: ""}}, f"metadata.labels[{c.MULTIKUEUE_ORIGIN_LABEL}]"),
    ({"annotations": {}}, f"metadata.annotations[{c.MANAGER_UID_ANNOTATION}]"),
], ids=["no-origin-label", "empty-origin-label", "no-manager-uid"])
def test_a_trainjob_that_is_not_a_copy_is_refused(worker_identity, marks, field):
    worker, api = worker_identity
    message = refusal(lambda: create(api, trainjob("not-a-copy", **marks)))
    assert by_policy(message), message
    assert f"TrainJob {OPENED}/not-a-copy: {field} is missing or empty" in message, message
    assert "creates only its own copies" in message, message
    assert get(worker.api, OPENED, "not-a-copy") is None


@pytest.mark.parametrize("spec,field", [
    ({"podSpecOverrides": [override(serviceAccountName="cluster-admin-sa")]},
     f"spec.podSpecOverrides[targetJobs: {c.NODE}].serviceAccountName"),
    ({"podSpecOverrides": [override(serviceAccountName="default")]},
     f"spec.podSpecOverrides[targetJobs: {c.NODE}].serviceAccountName"),
    ({"runtimePatches": [runtime_patch({"serviceAccountName": "cluster-admin-sa"})]},
     "spec.runtimePatches[manager: example.com/team-defaults].trainingRuntimeSpec.template.spec"
     f".replicatedJobs[name: {c.NODE}].template.spec.template.spec.serviceAccountName"),
], ids=["pod-spec-override", "pod-spec-override-default", "runtime-patch"])
def test_a_copy_that_chooses_a_service_account_is_refused(worker_identity, spec, field):
    worker, api = worker_identity
    message = refusal(lambda: create(api, trainjob("chooses-account", **spec)))
    assert by_policy(message), message
    assert f"TrainJob {OPENED}/chooses-account: {field} is set" in message, message
    assert "may not choose a ServiceAccount" in message, message


@pytest.mark.parametrize("spec,field", [
    ({"podSpecOverrides": [override(volumes=[{"name": "ok", "emptyDir": {}}, HOST_PATH])]},
     f"spec.podSpecOverrides[targetJobs: {c.NODE}].volumes[name: host].hostPath"),
    ({"runtimePatches": [runtime_patch({"volumes": [HOST_PATH]})]},
     "spec.runtimePatches[manager: example.com/team-defaults].trainingRuntimeSpec.template.spec"
     f".replicatedJobs[name: {c.NODE}].template.spec.template.spec.volumes[name: host].hostPath"),
], ids=["pod-spec-override", "runtime-patch"])
def test_a_copy_with_a_host_path_volume_is_refused(worker_identity, spec, field):
    worker, api = worker_identity
    message = refusal(lambda: create(api, trainjob("host-path", **spec)))
    assert by_policy(message), message
    assert f"TrainJob {OPENED}/host-path: {field} is set" in message, message
    assert "may not mount a directory of the Node" in message, message


def test_deleting_what_is_not_a_copy_is_refused(worker_identity):
    """A user's own TrainJob, and a copy Kueue's MultiKueue made (its origin label, no
    manager UID), stay: the identity may delete in the namespace, but only its copies."""
    worker, api = worker_identity
    create(worker.api, trainjob("users-own", labels={}, annotations={}))
    create(worker.api, trainjob("kueues-copy", labels={
        c.MULTIKUEUE_ORIGIN_LABEL: c.KUEUE_DEFAULT_ORIGIN}, annotations={}))
    message = refusal(lambda: delete(api, OPENED, "users-own"))
    assert by_policy(message), message
    assert (f"TrainJob {OPENED}/users-own: metadata.labels[{c.MULTIKUEUE_ORIGIN_LABEL}] is "
            "missing or empty") in message and "deletes only its own copies" in message, message
    message = refusal(lambda: delete(api, OPENED, "kueues-copy"))
    assert (f"TrainJob {OPENED}/kueues-copy: metadata.annotations[{c.MANAGER_UID_ANNOTATION}] "
            "is missing or empty") in message, message
    assert get(worker.api, OPENED, "users-own") and get(worker.api, OPENED, "kueues-copy")


def test_what_rbac_does_not_grant_is_refused(worker_identity):
    """As shipped: no update of a copy, no Pods, no Secrets, no status."""
    worker, api = worker_identity
    create(api, trainjob("as-shipped"))
    worker.core.create_namespaced_secret(OPENED, client.V1Secret(
        metadata=client.V1ObjectMeta(name="private"), string_data={"token": "not yours"}))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for verb, call in [
        ("patch", lambda: custom.patch_namespaced_custom_object(
            *TRAINER, OPENED, c.TRAINJOBS, "as-shipped",
            {"spec": {"podSpecOverrides": [override(serviceAccountName="x")]}},
            _content_type=MERGE_PATCH)),
        ("patch", lambda: custom.patch_namespaced_custom_object_status(
            *TRAINER, OPENED, c.TRAINJOBS, "as-shipped", {"status": {}},
            _content_type=MERGE_PATCH)),
        ("create", lambda: core.create_namespaced_pod(OPENED, pod("sneaky"))),
        ("delete", lambda: core.delete_namespaced_secret("private", OPENED)),
        ("get", lambda: core.read_namespaced_secret("private", OPENED)),
    ]:
        message = refusal(call)
        assert f'cannot {verb} resource' in message, message


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture
def more_rbac_than_shipped(worker_identity):
    """A Role someone binds to the identity by mistake: update TrainJobs and their status,
    write Pods and Secrets. The policy still holds it to its job."""
    worker, _ = worker_identity
    rbac = client.RbacAuthorizationV1Api(worker.api)
    name = "too-much-for-the-dispatcher"
    rbac.create_namespaced_role(OPENED, client.V1Role(
        metadata=client.V1ObjectMeta(name=name), rules=[
            client.V1PolicyRule(api_groups=[c.TRAINER_GROUP],
                                resources=[c.TRAINJOBS, f"{c.TRAINJOBS}/status"],
                                verbs=["update", "patch"]),
            client.V1PolicyRule(api_groups=[""], resources=["pods", "secrets"],
                                verbs=["create", "delete"])]))
    namespace, account = fixtures.WORKER_ACCESS_ACCOUNT
    rbac.create_namespaced_role_binding(OPENED, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account,
                                       namespace=namespace)]))
    yield
    rbac.delete_namespaced_role_binding(name, OPENED)
    rbac.delete_namespaced_role(name, OPENED)


def test_the_policy_holds_even_with_more_rbac(worker_identity, more_rbac_than_shipped):
    worker, api = worker_identity
    create(api, trainjob("suspended-copy"))
    worker.core.create_namespaced_secret(OPENED, client.V1Secret(
        metadata=client.V1ObjectMeta(name="someone-elses"), string_data={"k": "v"}))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def patch_spec():
        # A merge patch: the copy is suspended, so the CRD itself would allow the change.
        return custom.patch_namespaced_custom_object(
            *TRAINER, OPENED, c.TRAINJOBS, "suspended-copy",
            {"spec": {"podSpecOverrides": [override(serviceAccountName="x",
                                                    volumes=[HOST_PATH])]}},
            _content_type=MERGE_PATCH)

    def replace_spec():
        current = get(worker.api, OPENED, "suspended-copy")
        changed = copy.deepcopy(current)
        changed["spec"]["runtimePatches"] = [runtime_patch({"volumes": [HOST_PATH]})]
        return custom.replace_namespaced_custom_object(*TRAINER, OPENED, c.TRAINJOBS,
                                                       "suspended-copy", changed)

    for subject, call in [
        (f"TrainJob {OPENED}/suspended-copy: UPDATE refused", patch_spec),
        (f"TrainJob {OPENED}/suspended-copy: UPDATE refused", replace_spec),
        (f"TrainJob status {OPENED}/suspended-copy: UPDATE refused",
         lambda: custom.patch_namespaced_custom_object_status(
             *TRAINER, OPENED, c.TRAINJOBS, "suspended-copy",
             {"status": {"conditions": []}}, _content_type=MERGE_PATCH)),
        (f"Pod {OPENED}/sneaky: CREATE refused",
         lambda: core.create_namespaced_pod(OPENED, pod("sneaky"))),
        (f"Secret {OPENED}/someone-elses: DELETE refused",
         lambda: core.delete_namespaced_secret("someone-elses", OPENED)),
    ]:
        message = refusal(call)
        assert by_policy(message), message
        assert subject in message, message
        assert "only creates and deletes its copies of TrainJobs" in message, message
    assert "podSpecOverrides" not in get(worker.api, OPENED, "suspended-copy")["spec"]
    assert worker.core.read_namespaced_secret("someone-elses", OPENED)


def test_other_users_are_not_affected(worker_identity):
    """The administrator (and so the worker's own users) may still create what the
    dispatcher may not."""
    worker, _ = worker_identity
    body = trainjob("admins-choice", labels={}, annotations={},
                    podSpecOverrides=[override(serviceAccountName="trainer",
                                               volumes=[HOST_PATH])],
                    runtimePatches=[runtime_patch({"serviceAccountName": "trainer",
                                                   "volumes": [HOST_PATH]})])
    created = create(worker.api, body)
    assert created["spec"]["podSpecOverrides"][0]["serviceAccountName"] == "trainer"
    delete(worker.api, OPENED, "admins-choice")
