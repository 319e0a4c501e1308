"""The dispatcher's identity on a worker, as manifests/worker-access ships it (RBAC and the
ValidatingAdmissionPolicy), applied to a real worker apiserver and exercised with forged
requests: a client certificate for ``system:serviceaccount:trainjob-system:
trainjob-dispatcher`` from the worker's CA, which is what a leaked kubeconfig of the
manager's would hold. It creates and deletes the copies the dispatcher makes, in the
namespaces opened to it, and nothing else: a copy whose Pods would break Pod Security's
baseline level (or restricted, when the worker's administrator sets it), one into a
namespace that does not enforce that level (or pins a Pod Security version before 1.30),
or one past the policy's size bounds, is refused with the field or namespace and the
reason; other users are not affected.
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
from controller_kit.kubeclient import api_client
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone import mirror
from dispatcher.standalone.remote_copies import Created, RemoteCopies, SentDeletes
from trainjob import constants as c

TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
WORKER = "worker-1"
BASE = "worker-access"
POLICY = "trainjob-dispatcher-worker-access"
# The binding that holds copies to the administrator's level, and the ConfigMap it reads.
LEVEL_BINDING = "trainjob-dispatcher-worker-access-level"
LEVEL_CONFIGMAP = ("trainjob-system", "trainjob-dispatcher-pod-security")
# What is applied for real (the token Secret needs a token controller, and is not the
# point here).
APPLIED_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap"}
ENFORCE = fixtures.POD_SECURITY_ENFORCE
OPENED = "identity-policy-opened"  # opened as shipped: RBAC and Pod Security baseline
CLOSED = "identity-policy-closed"
# Opened by RBAC, with no Pod Security label / a weaker one / restricted's.
UNLABELLED = "identity-policy-unlabelled"
PRIVILEGED = "identity-policy-privileged"
RESTRICTED = "identity-policy-restricted"
# Opened at baseline, with pod-security.kubernetes.io/enforce-version pinned.
PINNED = {version: f"identity-policy-pinned-{version.replace('.', '-')}"
          for version in ("v1.29", "v1.30", "v1.31", "v1.32", "v1.40", "latest")}
NAMESPACES = (OPENED, CLOSED, UNLABELLED, PRIVILEGED, RESTRICTED, *PINNED.values())


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
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    bindings = {b["metadata"]["name"]: b["spec"]
                for b in named(objects, "ValidatingAdmissionPolicyBinding")}
    assert set(bindings) == {POLICY, LEVEL_BINDING}, bindings
    assert all(b["policyName"] == POLICY and b["validationActions"] == ["Deny"]
               for b in bindings.values()), bindings
    # The first holds to baseline, whatever the ConfigMap; its absence only skips the second
    # (never every write on the worker), which looks at TrainJob creates alone.
    assert "paramRef" not in bindings[POLICY] and "matchResources" not in bindings[POLICY]
    namespace, name = LEVEL_CONFIGMAP
    assert bindings[LEVEL_BINDING]["paramRef"] == {
        "name": name, "namespace": namespace, "parameterNotFoundAction": "Allow"}
    assert bindings[LEVEL_BINDING]["matchResources"]["resourceRules"] == [{
        "apiGroups": [c.TRAINER_GROUP], "apiVersions": ["*"], "operations": ["CREATE"],
        "resources": [c.TRAINJOBS]}]
    [level] = named(objects, "ConfigMap", name)
    assert level["metadata"]["namespace"] == namespace and level["data"] == {"level": "baseline"}


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
    return pod_template_patch(pod_spec, manager=manager)


def pod_template_patch(pod_spec: dict | None = None, metadata: dict | None = None,
                       manager: str = "example.com/team-defaults") -> dict:
    """A v2.3 ``spec.runtimePatches`` entry patching the pod template (spec and metadata)
    of replicated job node."""
    template = {k: v for k, v in (("metadata", metadata), ("spec", pod_spec)) if v is not None}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": c.NODE, "template": {"spec": {"template": template}}}]}}}}


# Where a runtime patch's pod template is, as the refusals name it.
PATCHED = ("spec.runtimePatches[manager: example.com/team-defaults].trainingRuntimeSpec"
           f".template.spec.replicatedJobs[name: {c.NODE}].template.spec.template")
APPARMOR = "container.apparmor.security.beta.kubernetes.io/"
# Each value Pod Security baseline (Kubernetes 1.34) allows where it restricts a field; root
# is baseline's to allow, restricted's to refuse.
BASELINE_ALLOWS = {
    "securityContext": {
        "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"},
        "appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-train"},
        "seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"},
        "sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"},
                    {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
        "windowsOptions": {"hostProcess": False}},
    "initContainers": [{"name": "init", "securityContext": {
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/train.json"},
        "seLinuxOptions": {"type": "container_init_t"}}}],
    "containers": [{"name": c.NODE, "securityContext": {
        "privileged": False, "allowPrivilegeEscalation": True, "procMount": "Default",
        "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN", "SYS_CHROOT", "AUDIT_WRITE"],
                         "drop": ["NET_RAW"]},
        "appArmorProfile": {"type": "RuntimeDefault"}}}],
    "volumes": [{"name": "shared", "nfs": {"server": "nfs.example.com", "path": "/data"}}]}


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
    """worker-access applied to one worker, OPENED opened to the dispatcher as shipped
    (RBAC and Pod Security baseline), RESTRICTED the same with restricted, UNLABELLED and
    PRIVILEGED by RBAC alone (no Pod Security label, privileged's) and CLOSED not at all,
    and an API client authenticating as the dispatcher's identity there."""
    worker = multicluster[WORKER]
    # Its namespace first: manifests/worker-namespace declares it, worker-access lives in it.
    objects = [o for o in kustomize.render("worker-namespace") + rendered()
               if o["kind"] in APPLIED_KINDS]
    kustomize.apply(worker.kubeconfig, objects)
    for name in NAMESPACES:
        fixtures.ensure_namespace(worker.api, name)
    worker.core.patch_namespace(PRIVILEGED, {"metadata": {"labels": {ENFORCE: "privileged"}}})
    fixtures.open_namespace_to_dispatcher(worker.api, OPENED)
    fixtures.open_namespace_to_dispatcher(worker.api, RESTRICTED, pod_security="restricted")
    for name in (UNLABELLED, PRIVILEGED):
        fixtures.open_namespace_to_dispatcher(worker.api, name, pod_security=None)
    for version, name in PINNED.items():
        worker.core.patch_namespace(name, {"metadata": {"labels": {
            ENFORCE + "-version": version}}})
        fixtures.open_namespace_to_dispatcher(worker.api, name)
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
    for name in NAMESPACES:
        worker.core.delete_namespace(name)
    kustomize.kubectl(worker.kubeconfig, "delete", "--ignore-not-found", "--wait=false",
                      "-f", "-", stdin=yaml.safe_dump_all(
                          [o for o in objects if o["kind"] != "Namespace"]))


def test_a_copy_as_the_dispatcher_makes_it_is_created_and_deleted(worker_identity):
    """The dispatcher's own write path (RemoteCopies) through the policy, into a namespace
    that enforces Pod Security baseline: a manager job with node selectors, tolerations,
    volumes that are not hostPath, security contexts with what baseline allows and runtime
    patches of every shape (Kueue's, which would set a ServiceAccount, stays behind:
    build_remote leaves it out) is copied, and the copy deleted."""
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
                pod_template_patch(BASELINE_ALLOWS, metadata={"annotations": {
                    APPARMOR + c.NODE: "runtime/default"}}, manager="example.com/hardening"),
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


def container(security_context: dict, name: str = c.NODE) -> dict:
    return {"name": name, "securityContext": security_context}


HOST_PATH_REASON = "Pod Security baseline forbids hostPath volumes (a directory of the Node)"


# A TrainJob's fragment of pod spec, where the refusal says it is (after the patched pod
# template's path) and why. Every control of Pod Security baseline that a fragment can set.
BASELINE_FORBIDS = [
    pytest.param({"podSpecOverrides": [override(volumes=[{"name": "ok", "emptyDir": {}},
                                                         HOST_PATH])]},
                 f"spec.podSpecOverrides[targetJobs: {c.NODE}].volumes[name: host].hostPath",
                 HOST_PATH_REASON, id="override-host-path"),
    pytest.param({"volumes": [HOST_PATH]}, ".spec.volumes[name: host].hostPath",
                 HOST_PATH_REASON, id="host-path"),
    pytest.param({"containers": [container({"privileged": True})]},
                 f".spec.containers[name: {c.NODE}].securityContext.privileged",
                 "Pod Security baseline forbids privileged containers", id="privileged"),
    pytest.param({"initContainers": [container({"privileged": True}, "init")]},
                 ".spec.initContainers[name: init].securityContext.privileged",
                 "Pod Security baseline forbids privileged containers",
                 id="privileged-init-container"),
    pytest.param({"containers": [container({"capabilities": {
                      "add": ["CHOWN", "SYS_ADMIN", "NET_RAW"], "drop": ["ALL"]}})]},
                 f".spec.containers[name: {c.NODE}].securityContext.capabilities.add",
                 "Pod Security baseline forbids adding SYS_ADMIN, NET_RAW (it allows "
                 "AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, "
                 "SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT)", id="capabilities"),
    pytest.param({"containers": [container({"procMount": "Unmasked"})]},
                 f".spec.containers[name: {c.NODE}].securityContext.procMount",
                 "Pod Security baseline forbids a /proc mount other than Default",
                 id="proc-mount"),
    pytest.param({"containers": [container({"seLinuxOptions": {"type": "spc_t"}})]},
                 f".spec.containers[name: {c.NODE}].securityContext.seLinuxOptions.type",
                 "Pod Security baseline forbids the SELinux type spc_t", id="selinux-type"),
    pytest.param({"securityContext": {"seLinuxOptions": {"user": "system_u"}}},
                 ".spec.securityContext.seLinuxOptions.user",
                 "Pod Security baseline forbids setting an SELinux user", id="selinux-user"),
    pytest.param({"initContainers": [container({"seLinuxOptions": {"role": "sysadm_r"}},
                                               "init")]},
                 ".spec.initContainers[name: init].securityContext.seLinuxOptions.role",
                 "Pod Security baseline forbids setting an SELinux role", id="selinux-role"),
    pytest.param({"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
                 ".spec.securityContext.seccompProfile.type",
                 "Pod Security baseline forbids the seccomp profile Unconfined",
                 id="pod-seccomp"),
    pytest.param({"containers": [container({"seccompProfile": {"type": "Unconfined"}})]},
                 f".spec.containers[name: {c.NODE}].securityContext.seccompProfile.type",
                 "Pod Security baseline forbids the seccomp profile Unconfined", id="seccomp"),
    pytest.param({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
                 ".spec.securityContext.appArmorProfile.type",
                 "Pod Security baseline forbids the AppArmor profile Unconfined",
                 id="pod-apparmor"),
    pytest.param({"containers": [container({"appArmorProfile": {"type": "Unconfined"}})]},
                 f".spec.containers[name: {c.NODE}].securityContext.appArmorProfile.type",
                 "Pod Security baseline forbids the AppArmor profile Unconfined", id="apparmor"),
    pytest.param({"metadata": {"annotations": {APPARMOR + c.NODE: "unconfined"}}},
                 f".metadata.annotations[{APPARMOR}{c.NODE}]",
                 "Pod Security baseline forbids the AppArmor profile unconfined",
                 id="apparmor-annotation"),
    pytest.param({"metadata": {"annotations": {APPARMOR + c.NODE: "my-own-profile"}}},
                 f".metadata.annotations[{APPARMOR}{c.NODE}]",
                 "Pod Security baseline forbids the AppArmor profile my-own-profile (it allows "
                 "runtime/default and localhost/*)", id="apparmor-annotation-custom"),
    pytest.param({"securityContext": {"sysctls": [
                     {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                     {"name": "kernel.msgmax", "value": "65536"}]}},
                 ".spec.securityContext.sysctls",
                 "Pod Security baseline forbids kernel.msgmax (it allows kernel.shm_rmid_forced, ",
                 id="sysctls"),
    pytest.param({"securityContext": {"windowsOptions": {"hostProcess": True}}},
                 ".spec.securityContext.windowsOptions.hostProcess",
                 "Pod Security baseline forbids Windows HostProcess containers",
                 id="pod-host-process"),
    pytest.param({"containers": [container({"windowsOptions": {"hostProcess": True}})]},
                 f".spec.containers[name: {c.NODE}].securityContext.windowsOptions.hostProcess",
                 "Pod Security baseline forbids Windows HostProcess containers",
                 id="host-process"),
]


def with_fragment(fragment: dict) -> dict:
    """``spec`` fields carrying ``fragment``: a TrainJob spec as is, or a pod template's
    (``metadata``, or pod spec fields) in a runtime patch."""
    if "podSpecOverrides" in fragment:
        return fragment
    fragment = dict(fragment)
    metadata = fragment.pop("metadata", None)
    return {"runtimePatches": [pod_template_patch(fragment or None, metadata)]}


def at(field: str) -> str:
    """A field's path as the refusals name it: a runtime patch's pod template's, or as is."""
    return PATCHED + field if field.startswith(".") else field


@pytest.mark.parametrize("fragment,field,reason", BASELINE_FORBIDS)
def test_a_copy_that_breaks_pod_security_baseline_is_refused(worker_identity, fragment, field,
                                                              reason):
    """Whatever the namespace enforces (even restricted), the policy refuses a copy whose
    own fragment of pod spec sets what baseline forbids, naming the field and the reason."""
    worker, api = worker_identity
    for namespace in (OPENED, RESTRICTED):
        message = refusal(lambda: create(api, trainjob("pod-security", namespace,
                                                       **with_fragment(fragment))))
        assert by_policy(message), message
        assert f"TrainJob {namespace}/pod-security: {at(field)}: {reason}" in message, message
        assert "copies only TrainJobs whose Pods meet Pod Security baseline" in message, message
        assert get(worker.api, namespace, "pod-security") is None


def test_each_field_baseline_forbids_is_named(worker_identity):
    """Several at once: each is named with its reason, in one refusal."""
    _, api = worker_identity
    message = refusal(lambda: create(api, trainjob("many", **with_fragment({
        "volumes": [HOST_PATH], "securityContext": {"seccompProfile": {"type": "Unconfined"}},
        "containers": [container({"privileged": True, "procMount": "Unmasked"})]}))))
    for field, reason in [
            (".spec.volumes[name: host].hostPath", HOST_PATH_REASON),
            (f".spec.containers[name: {c.NODE}].securityContext.privileged",
             "Pod Security baseline forbids privileged containers"),
            (f".spec.containers[name: {c.NODE}].securityContext.procMount",
             "Pod Security baseline forbids a /proc mount"),
            (".spec.securityContext.seccompProfile.type",
             "Pod Security baseline forbids the seccomp profile Unconfined")]:
        assert f"{PATCHED}{field}: {reason}" in message, message


def test_what_a_fragment_cannot_carry_never_reaches_the_pods(worker_identity):
    """Host namespaces, host ports (and probes) are not in the fragments the TrainJob CRD
    keeps: the apiserver drops them from a copy, which is admitted without them."""
    worker, api = worker_identity
    body = trainjob("host-namespaces", **with_fragment({
        "hostNetwork": True, "hostPID": True, "hostIPC": True, "hostUsers": True,
        "containers": [{"name": c.NODE, "ports": [{"containerPort": 80, "hostPort": 80}],
                        "livenessProbe": {"tcpSocket": {"port": 80, "host": "10.0.0.1"}}}]}))
    create(api, body)
    stored = get(worker.api, OPENED, "host-namespaces")
    [patch] = stored["spec"]["runtimePatches"]
    [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod_spec = job["template"]["spec"]["template"]["spec"]
    assert pod_spec == {"containers": [{"name": c.NODE}]}, pod_spec
    delete(api, OPENED, "host-namespaces")


@pytest.mark.parametrize("namespace,found", [
    (UNLABELLED, "has no label pod-security.kubernetes.io/enforce"),
    (PRIVILEGED, "has pod-security.kubernetes.io/enforce=privileged, weaker than baseline"),
], ids=["no-label", "privileged"])
def test_a_namespace_that_does_not_enforce_baseline_is_refused(worker_identity, namespace,
                                                               found):
    """Opened by RBAC, but Pod Security Admission would let any Pod in there: no copy."""
    worker, api = worker_identity
    message = refusal(lambda: create(api, trainjob("weak-namespace", namespace)))
    assert by_policy(message), message
    assert f"TrainJob {namespace}/weak-namespace: namespace {namespace} {found}" in message, (
        message)
    assert ("only into namespaces that enforce Pod Security baseline or stronger (the least "
            f"the policy accepts; ConfigMap {'/'.join(LEVEL_CONFIGMAP)} may set restricted); "
            "its administrator labels the namespace pod-security.kubernetes.io/enforce=baseline "
            "when opening it") in message, message
    assert get(worker.api, namespace, "weak-namespace") is None


def test_a_copy_in_a_namespace_without_the_label_may_still_be_deleted(worker_identity):
    """The label is looked at when a copy is made, not when it goes: a copy made before the
    label was removed is still the dispatcher's to delete."""
    worker, api = worker_identity
    create(worker.api, trainjob("made-before", UNLABELLED))
    delete(api, UNLABELLED, "made-before")
    eventually(lambda: get(worker.api, UNLABELLED, "made-before"), lambda obj: obj is None,
               expected=f"TrainJob {UNLABELLED}/made-before deleted by the dispatcher's identity")


def test_a_namespace_enforcing_more_than_baseline_takes_copies(worker_identity):
    worker, api = worker_identity
    create(api, trainjob("stronger", RESTRICTED))
    delete(api, RESTRICTED, "stronger")


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
    dispatcher may not, in a namespace that enforces no Pod Security level too."""
    worker, _ = worker_identity
    for namespace in (OPENED, UNLABELLED):
        body = trainjob("admins-choice", namespace, labels={}, annotations={},
                        podSpecOverrides=[override(serviceAccountName="trainer",
                                                   volumes=[HOST_PATH])],
                        runtimePatches=[pod_template_patch({
                            "serviceAccountName": "trainer", "volumes": [HOST_PATH],
                            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
                            "containers": [container({"privileged": True, "capabilities": {
                                "add": ["SYS_ADMIN"]}})]},
                            metadata={"annotations": {APPARMOR + c.NODE: "unconfined"}})])
        created = create(worker.api, body)
        assert created["spec"]["podSpecOverrides"][0]["serviceAccountName"] == "trainer"
        delete(worker.api, namespace, "admins-choice")


# --- the administrator's level ------------------------------------------------------

def set_level(worker, level: str | None) -> None:
    """The level in the ConfigMap the level binding reads (None: no ConfigMap)."""
    namespace, name = LEVEL_CONFIGMAP
    try:
        worker.core.delete_namespaced_config_map(name, namespace)
    except ApiException as err:
        if err.status != 404:
            raise
    if level is not None:
        worker.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name), data={"level": level}))


# Baseline allows a root user; restricted does not: which one holds shows on this copy.
RUNS_AS_ROOT = {"runtimePatches": [runtime_patch({"securityContext": {"runAsUser": 0}})]}


def level_in_force(api) -> str:
    """Which level the policy holds copies into RESTRICTED to, as a dry run shows."""
    try:
        create(api, trainjob("level-probe", RESTRICTED, **RUNS_AS_ROOT), dry_run="All")
        return "baseline"
    except ApiException as err:
        body = err.body or ""
        if "restricted forbids running as UID 0" in body:
            return "restricted"
        return body


@pytest.fixture
def administrator_level(worker_identity):
    """Set the administrator's level and wait until the policy holds copies to it; baseline
    again afterwards."""
    worker, api = worker_identity

    def use(level: str | None, expected: str) -> None:
        set_level(worker, level)
        eventually(lambda: level_in_force(api), lambda found: expected in found, timeout=30,
                   expected=f"the policy holding copies to {expected} once ConfigMap "
                   f"{'/'.join(LEVEL_CONFIGMAP)} says {level}")

    yield use
    use("baseline", "baseline")


def test_an_administrator_sets_restricted(worker_identity, administrator_level):
    """With restricted, the copies' own fragments are held to what restricted forbids too,
    and only a namespace enforcing restricted takes them; the refusals say where the level
    comes from."""
    worker, api = worker_identity
    administrator_level("restricted", "restricted")
    source = f"as ConfigMap {'/'.join(LEVEL_CONFIGMAP)} sets in data.level"
    message = refusal(lambda: create(api, trainjob("needs-restricted")))
    assert by_policy(message), message
    assert (f"TrainJob {OPENED}/needs-restricted: namespace {OPENED} has "
            "pod-security.kubernetes.io/enforce=baseline, weaker than restricted: the dispatcher "
            "on this worker copies TrainJobs only into namespaces that enforce Pod Security "
            f"restricted or stronger ({source}); its administrator labels the namespace "
            "pod-security.kubernetes.io/enforce=restricted when opening it") in message, message
    # Without the label the binding holding to baseline refuses too; the refusal is the first
    # binding's to deny, either one, and says restricted may be needed.
    message = refusal(lambda: create(api, trainjob("needs-restricted", UNLABELLED)))
    assert (f"namespace {UNLABELLED} has no label pod-security.kubernetes.io/enforce" in message
            and ("enforce Pod Security restricted or stronger" in message
                 or "may set restricted" in message)), message
    for fragment, field, reason in RESTRICTED_FORBIDS:
        message = refusal(lambda: create(api, trainjob("restricted", RESTRICTED,
                                                       **with_fragment(fragment))))
        assert f"TrainJob {RESTRICTED}/restricted: {at(field)}: {reason}" in message, message
        assert f"meet Pod Security restricted ({source})" in message, message
    # Baseline's refusals hold as they were.
    message = refusal(lambda: create(api, trainjob("restricted", RESTRICTED, **with_fragment(
        {"containers": [container({"privileged": True})]}))))
    assert (f"{PATCHED}.spec.containers[name: {c.NODE}].securityContext.privileged: Pod "
            "Security baseline forbids privileged containers") in message, message
    # A copy whose fragments meet restricted, into a namespace enforcing it, is made.
    create(api, trainjob("meets-restricted", RESTRICTED, **with_fragment(RESTRICTED_ALLOWS)))
    delete(api, RESTRICTED, "meets-restricted")
    assert get(worker.api, RESTRICTED, "restricted") is None


RESTRICTED_ALLOWS = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [container({"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                              "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}})],
    "volumes": [{"name": n, **source} for n, source in [
        ("config", {"configMap": {"name": "c"}}), ("scratch", {"emptyDir": {}}),
        ("data", {"persistentVolumeClaim": {"claimName": "d"}}),
        ("driver", {"csi": {"driver": "example.com"}}), ("token", {"projected": {"sources": []}}),
        ("key", {"secret": {"secretName": "k"}}), ("info", {"downwardAPI": {"items": []}})]]}

RESTRICTED_FORBIDS = [
    ({"containers": [container({"allowPrivilegeEscalation": True})]},
     f".spec.containers[name: {c.NODE}].securityContext.allowPrivilegeEscalation",
     "Pod Security restricted forbids privilege escalation (it must be false)"),
    ({"securityContext": {"runAsNonRoot": False}}, ".spec.securityContext.runAsNonRoot",
     "Pod Security restricted forbids running as root (it must be true)"),
    ({"initContainers": [container({"runAsNonRoot": False}, "init")]},
     ".spec.initContainers[name: init].securityContext.runAsNonRoot",
     "Pod Security restricted forbids running as root (it must be true)"),
    ({"securityContext": {"runAsUser": 0}}, ".spec.securityContext.runAsUser",
     "Pod Security restricted forbids running as UID 0"),
    ({"containers": [container({"runAsUser": 0})]},
     f".spec.containers[name: {c.NODE}].securityContext.runAsUser",
     "Pod Security restricted forbids running as UID 0"),
    ({"containers": [container({"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"],
                                                 "drop": ["ALL"]}})]},
     f".spec.containers[name: {c.NODE}].securityContext.capabilities.add",
     "Pod Security restricted forbids adding CHOWN (it allows NET_BIND_SERVICE)"),
    ({"containers": [container({"capabilities": {"drop": ["NET_RAW"]}})]},
     f".spec.containers[name: {c.NODE}].securityContext.capabilities.drop",
     "Pod Security restricted requires dropping ALL"),
    ({"volumes": [{"name": "shared", "nfs": {"server": "nfs.example.com", "path": "/"}}]},
     ".spec.volumes[name: shared]", "Pod Security restricted forbids nfs volumes (it allows "
     "configMap, csi, downwardAPI, emptyDir, ephemeral, image, persistentVolumeClaim, "
     "projected, secret)"),
    ({"podSpecOverrides": [override(volumes=[{"name": "repo", "gitRepo": {
        "repository": "https://example.com/r.git"}}])]},
     f"spec.podSpecOverrides[targetJobs: {c.NODE}].volumes[name: repo]",
     "Pod Security restricted forbids gitRepo volumes"),
]


def test_without_the_configmap_baseline_still_holds(worker_identity, administrator_level):
    """No ConfigMap: the level binding is skipped, the policy is not: baseline, the
    identity's other limits, and nothing else on the worker refused."""
    worker, api = worker_identity
    administrator_level(None, "baseline")
    message = refusal(lambda: create(api, trainjob("no-configmap", UNLABELLED)))
    assert "has no label pod-security.kubernetes.io/enforce" in message, message
    message = refusal(lambda: create(api, trainjob("no-configmap", **with_fragment(
        {"containers": [container({"privileged": True})]}))))
    assert "Pod Security baseline forbids privileged containers" in message, message
    message = refusal(lambda: create(api, trainjob("no-configmap", labels={})))
    assert "multikueue-origin] is missing" in message, message
    create(api, trainjob("no-configmap"))
    delete(api, OPENED, "no-configmap")
    create(worker.api, trainjob("admins-own", UNLABELLED, labels={}, annotations={}))
    delete(worker.api, UNLABELLED, "admins-own")


def test_a_level_that_is_not_one_is_refused(worker_identity, administrator_level):
    """A typo in the ConfigMap stops the copies, saying which ConfigMap and value; it never
    lowers the level."""
    _, api = worker_identity
    administrator_level("strict", "not baseline or restricted")
    message = refusal(lambda: create(api, trainjob("typo")))
    assert by_policy(message), message
    assert (f"TrainJob {OPENED}/typo: the Pod Security level as ConfigMap "
            f"{'/'.join(LEVEL_CONFIGMAP)} sets in data.level is strict, not baseline or "
            "restricted") in message, message


# --- bounds -------------------------------------------------------------------------

def replicated_jobs(count: int, pod_spec: dict | None = None, manager: str = "example.com/m",
                    metadata: dict | None = None) -> dict:
    """A runtime patch of ``count`` replicated jobs' pod templates."""
    template = {k: v for k, v in (("metadata", metadata), ("spec", pod_spec)) if v is not None}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": f"job-{i}", "template": {"spec": {
            "template": copy.deepcopy(template)}}} for i in range(count)]}}}}


def containers(count: int, security_context: dict | None = None, prefix: str = "c") -> list:
    return [{"name": f"{prefix}{i}", **({"securityContext": security_context}
                                        if security_context else {})} for i in range(count)]


TEMPLATES = ("spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[]"
             ".template.spec.template")
BOUNDS = "the dispatcher on this worker copies only TrainJobs within these bounds"


@pytest.mark.parametrize("spec,found", [
    ({"runtimePatches": [replicated_jobs(17, manager="example.com/a"),
                         replicated_jobs(16, manager="example.com/b")]},
     "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs: 33 replicated "
     "jobs in all, over the limit of 32"),
    ({"runtimePatches": [runtime_patch({"containers": containers(40),
                                        "initContainers": containers(25, prefix="i")})]},
     f"{TEMPLATES}.spec.initContainers, .spec.containers: 65 containers and init containers "
     "in all, over the limit of 64"),
    ({"podSpecOverrides": [override() for _ in range(65)]},
     "spec.podSpecOverrides: 65 entries, over the limit of 64"),
    ({"runtimePatches": [runtime_patch({"containers": containers(1, {"capabilities": {
        "add": ["CHOWN"] * 513}})})]},
     f"{TEMPLATES}.spec.securityContext.sysctls, .spec.[init]containers[].securityContext"
     ".capabilities.add and .drop, .spec.[init]containers[].ports: 513 entries in all, over "
     "the limit of 512"),
], ids=["replicated-jobs", "containers", "pod-spec-overrides", "capabilities"])
def test_an_oversized_copy_is_refused_naming_the_list(worker_identity, spec, found):
    """Past the policy's bounds (which keep its checks within the apiserver's CEL cost
    limit) a copy is refused naming the list, its size and the limit, before any check
    whose cost grows with it runs."""
    _, api = worker_identity
    message = refusal(lambda: create(api, trainjob("oversized", **spec)))
    assert by_policy(message), message
    assert f"TrainJob {OPENED}/oversized: {found}: {BOUNDS}" in message, message


# Everything a pod template can set against restricted, and so against baseline.
FORBIDDEN_CONTAINER = {
    "privileged": True, "procMount": "Unmasked", "allowPrivilegeEscalation": True,
    "runAsNonRoot": False, "runAsUser": 0, "seccompProfile": {"type": "Unconfined"},
    "capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"], "drop": ["NET_RAW"]},
    "seLinuxOptions": {"type": "spc_t", "user": "u", "role": "r"},
    "appArmorProfile": {"type": "Unconfined"}, "windowsOptions": {"hostProcess": True}}


def costliest(extra_containers: int = 0) -> dict:
    """A TrainJob at every bound of the policy (32 pod templates, 64 containers, 128
    volumes of 512 fields, 128 annotations, 512 capabilities and sysctls), each of them
    forbidden at restricted: the most its checks can be asked to say."""
    pod_spec = {
        "securityContext": {**{k: v for k, v in FORBIDDEN_CONTAINER.items() if k in (
            "runAsNonRoot", "runAsUser", "seccompProfile", "seLinuxOptions",
            "appArmorProfile", "windowsOptions")},
            "sysctls": [{"name": f"kernel.sysctl{i}", "value": "1"} for i in range(8)]},
        "volumes": [{"name": f"volume-{i}", "hostPath": {"path": "/"},
                     "nfs": {"server": "nfs.example.com", "path": "/"},
                     "gitRepo": {"repository": "https://example.com/r.git"}}
                    for i in range(4)],
        "containers": containers(2, FORBIDDEN_CONTAINER)}
    metadata = {"annotations": {f"{APPARMOR}c{i}": "unconfined" for i in range(4)}}
    patches = [replicated_jobs(2, pod_spec, f"example.com/manager-{i:02d}", metadata)
               for i in range(16)]
    job = patches[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    job["template"]["spec"]["template"]["spec"] = dict(
        pod_spec, containers=containers(2 + extra_containers, FORBIDDEN_CONTAINER))
    return {"runtimePatches": patches}


def test_the_costliest_copy_within_the_bounds_is_refused_field_by_field(worker_identity,
                                                                        administrator_level):
    """At every bound and with everything forbidden, at baseline and at restricted: the
    refusal names the first fields and how many more, within the apiserver's cost limit
    and its 5 KiB for a message; one container more is refused by the bounds."""
    _, api = worker_identity
    first = ("spec.runtimePatches[manager: example.com/manager-00].trainingRuntimeSpec"
             ".template.spec.replicatedJobs[name: job-0].template.spec.template.spec"
             f".volumes[name: volume-0].hostPath: {HOST_PATH_REASON}")
    for level in ("baseline", "restricted"):
        if level == "restricted":
            administrator_level("restricted", "restricted")
        message = refusal(lambda: create(api, trainjob("costliest", RESTRICTED,
                                                       **costliest())))
        assert by_policy(message), message
        assert f"TrainJob {RESTRICTED}/costliest: {first}" in message, message
        assert " more: the dispatcher on this worker copies only TrainJobs whose Pods meet " \
            "Pod Security" in message, message
        message = refusal(lambda: create(api, trainjob("costliest", RESTRICTED,
                                                       **costliest(extra_containers=1))))
        assert "65 containers and init containers in all, over the limit of 64" in message, (
            message)


# --- the namespace's enforce-version ------------------------------------------------

SYSCTL_1_32 = {"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_rmem",
                                                "value": "4096 87380 6291456"}]}}
SELINUX_1_31 = {"containers": [container({"seLinuxOptions": {"type": "container_engine_t"}})]}


@pytest.mark.parametrize("version,fragment,field,reason", [
    ("v1.31", SYSCTL_1_32, ".spec.securityContext.sysctls",
     "Pod Security baseline forbids net.ipv4.tcp_rmem (it allows kernel.shm_rmid_forced, "),
    ("v1.30", SELINUX_1_31, f".spec.containers[name: {c.NODE}].securityContext.seLinuxOptions"
     ".type", "Pod Security baseline forbids the SELinux type container_engine_t (it allows "
     "container_t, container_init_t, container_kvm_t)"),
], ids=["sysctl-before-1.32", "selinux-type-before-1.31"])
def test_a_pinned_version_is_held_to_its_own_lists(worker_identity, version, fragment, field,
                                                   reason):
    """Where baseline differs between the Kubernetes versions the project supports, a
    namespace pinned to one holds the copies to that version's lists (what its Pod Security
    Admission would refuse at Pod creation is refused with the copy); unpinned, latest, or
    newer, they are the newest's."""
    _, api = worker_identity
    namespace = PINNED[version]
    message = refusal(lambda: create(api, trainjob("pinned", namespace,
                                                   **with_fragment(fragment))))
    assert by_policy(message), message
    assert f"TrainJob {namespace}/pinned: {at(field)}: {reason}" in message, message
    assert (f"as of Kubernetes {version} (namespace {namespace} has "
            f"pod-security.kubernetes.io/enforce-version={version})") in message, message
    for newer in ("v1.32", "v1.40", "latest"):
        create(api, trainjob("pinned", PINNED[newer], **with_fragment(fragment)))
        delete(api, PINNED[newer], "pinned")


def test_a_namespace_pinned_before_1_30_is_refused(worker_identity):
    _, api = worker_identity
    namespace = PINNED["v1.29"]
    message = refusal(lambda: create(api, trainjob("too-old", namespace)))
    assert by_policy(message), message
    assert (f"TrainJob {namespace}/too-old: namespace {namespace} has "
            "pod-security.kubernetes.io/enforce-version=v1.29, older than v1.30") in message, (
        message)
    assert "its administrator removes the label or sets it to latest" in message, message
