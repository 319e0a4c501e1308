"""Trainer progress reports (``status.trainerStatus``) on a real worker (worker-2): the
operator with ``--enable-trainer-status`` wires the trainer pods to its endpoint, and a
pod-like client posting with the pod's token updates the TrainJob's status; anything else
is refused and changes nothing.

kwok pods run no containers, so no kubelet projects the token the JobSet asks for. The
tests get the same token the way a kubelet does: a TokenRequest for the pod's service
account, with the audience read from the JobSet's projected volume and bound to the pod.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures
from clusters.controlplane import free_port
from clusters.crds import manifests_dir
from clusters.pki import service_account_user
from clusters.testing import eventually
from trainjob import constants as c
from trainjob import trainer_status as ts

WORKER = "worker-2"
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
SERVICE_ACCOUNT = "reporter"
RUNTIME = "reporting-torch"
PROGRESS = {"progressPercentage": 40, "estimatedRemainingSeconds": 600,
            "metrics": [{"name": "loss", "value": "0.25"}, {"name": "eval_accuracy",
                                                              "value": "0.91"}],
            "lastUpdatedTime": "2025-06-01T12:00:00Z"}


class Endpoint:
    """The operator's trainer status endpoint, as a pod would call it."""

    def __init__(self, port: int, ca: Path):
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca))

    def post(self, path: str, body: Any, token: str | None = None,
             raw: bytes | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                           timeout=10)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request("POST", path, body=raw if raw is not None else json.dumps(body),
                         headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()


@pytest.fixture(scope="module")
def operator_identity(multicluster, tmp_path_factory):
    """A kubeconfig for worker-2 as the operator's ServiceAccount with the shipped
    ClusterRole and binding (manifests/operator/rbac.yaml): what the endpoint needs
    (TokenReview, status apply) must be granted there."""
    worker = multicluster[WORKER]
    rbac = client.RbacAuthorizationV1Api(worker.api)
    documents = [d for d in yaml.safe_load_all(
        (manifests_dir() / "operator" / "rbac.yaml").read_text()) if d]
    created = []
    for document in documents:
        create = (rbac.create_cluster_role if document["kind"] == "ClusterRole"
                  else rbac.create_cluster_role_binding)
        try:
            create(document)
            created.append(document)
        except ApiException as err:
            if err.status != 409:
                raise
    subject = documents[1]["subjects"][0]
    user, groups = service_account_user(subject["namespace"], subject["name"])
    path = multicluster.harness.issue_user_kubeconfig(
        WORKER, user, groups, tmp_path_factory.mktemp("identity") / "operator.kubeconfig")
    yield SimpleNamespace(name=WORKER, kubeconfig=path)
    for document in created:
        delete = (rbac.delete_cluster_role if document["kind"] == "ClusterRole"
                  else rbac.delete_cluster_role_binding)
        delete(document["metadata"]["name"])


@pytest.fixture
def reporting(multicluster, namespace, run_operator, operator_identity, tmp_path):
    """worker-2's operator, as its shipped role allows, with the endpoint on; a runtime
    whose pods run as ``reporter``."""
    worker = multicluster[WORKER]
    cert_dir = tmp_path / "certs"
    ca = multicluster.harness.issue_serving_certificate(WORKER, cert_dir)
    shutil.copyfile(ca, cert_dir / "ca.crt")  # where cert-manager puts it
    port = free_port()
    run_operator(operator_identity, "--webhook-cert-dir", str(cert_dir), "--webhook-port",
                 str(free_port()), "--enable-trainer-status", "--trainer-status-port", str(port))
    worker.core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT)))
    runtime = fixtures.torch_runtime(RUNTIME, namespace=namespace)
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["serviceAccountName"] = SERVICE_ACCOUNT
    fixtures.install_runtime(worker.api, runtime)
    return worker, Endpoint(port, cert_dir / "ca.crt")


def create_trainjob(worker, namespace: str, name: str, managed_by: str | None = None) -> dict:
    spec: dict[str, Any] = {"runtimeRef": {"name": RUNTIME, "apiGroup": c.TRAINER_GROUP,
                                           "kind": c.TRAININGRUNTIME_KIND}}
    if managed_by:
        spec["managedBy"] = managed_by
    return worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name}, "spec": spec})


def get_trainjob(worker, namespace: str, name: str) -> dict:
    return worker.custom.get_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, name)


def trainer_status(worker, namespace: str, name: str) -> dict | None:
    return (get_trainjob(worker, namespace, name).get("status") or {}).get("trainerStatus")


def trainer_pod_spec(worker, namespace: str, name: str) -> dict:
    """The JobSet's trainer pod spec, once the operator has made the JobSet."""
    jobset = eventually(
        lambda: worker.custom.get_namespaced_custom_object(
            c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, name),
        lambda found: found is not None, expected=f"JobSet {namespace}/{name}")
    (node,) = [j for j in jobset["spec"]["replicatedJobs"] if j["name"] == c.NODE]
    return node["template"]["spec"]["template"]["spec"]


def wiring(pod_spec: dict) -> tuple[str, str]:
    """(endpoint path, token audience) as the trainer pod is told them."""
    (container,) = pod_spec["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == ts.VOLUME_NAME]
    (token,) = [s["serviceAccountToken"] for s in volume["projected"]["sources"]
                if "serviceAccountToken" in s]
    return urlsplit(env[ts.ENV_URL]).path, token["audience"]


def trainer_pod(worker, namespace: str, job: str) -> client.V1Pod:
    return eventually(
        lambda: worker.core.list_namespaced_pod(
            namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={job},"
                                      f"{c.JOBSET_REPLICATED_JOB_LABEL}={c.NODE}").items,
        lambda pods: bool(pods), expected=f"a trainer pod of {job}")[0]


def pod_token(worker, namespace: str, job: str, audience: str,
              pod: client.V1Pod | None = None) -> str:
    """The token a kubelet would project into one of ``job``'s trainer pods."""
    pod = pod or trainer_pod(worker, namespace, job)
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[audience], expiration_seconds=ts.TOKEN_EXPIRY_SECONDS,
        bound_object_ref=client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid)))
    return worker.core.create_namespaced_service_account_token(
        pod.spec.service_account_name, namespace, request).status.token


def test_the_trainer_pods_are_wired_to_the_endpoint(reporting, namespace):
    worker, _ = reporting
    create_trainjob(worker, namespace, "wired")
    pod_spec = trainer_pod_spec(worker, namespace, "wired")
    (container,) = pod_spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[ts.ENV_URL] == (
        "https://training-operator-webhook.training-operator-system.svc:"
        f"{reporting[1].port}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/"
        "trainjobs/wired/status")
    assert env[ts.ENV_CA_CERT] == "/var/run/secrets/kubeflow/trainer/ca.crt"
    assert env[ts.ENV_TOKEN] == "/var/run/secrets/kubeflow/trainer/token"
    assert {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer",
            "readOnly": True} in container["volumeMounts"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "kubeflow-trainer-token"]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {
        "audience": f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/wired/status",
        "expirationSeconds": 3600, "path": "token"}
    assert sources[1]["configMap"]["name"] == "wired-tls-config"
    configmap = worker.core.read_namespaced_config_map("wired-tls-config", namespace)
    assert configmap.data["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert configmap.metadata.owner_references[0].kind == c.TRAINJOB_KIND
    assert configmap.metadata.owner_references[0].controller
    # Other jobs (the initializers) are not wired, as upstream wires the trainer only.
    jobset = worker.custom.get_namespaced_custom_object(
        c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, "wired")
    for job in jobset["spec"]["replicatedJobs"]:
        if job["name"] != c.NODE:
            spec = job["template"]["spec"]["template"]["spec"]
            assert ts.VOLUME_NAME not in [v["name"] for v in spec.get("volumes") or []]


def test_a_trainer_pod_reports_progress(reporting, namespace):
    worker, endpoint = reporting
    create_trainjob(worker, namespace, "progress")
    path, audience = wiring(trainer_pod_spec(worker, namespace, "progress"))
    token = pod_token(worker, namespace, "progress", audience)
    # The operator writes Created after the JobSet: wait for it, so that the report is
    # seen to keep the rest of the status.
    eventually(lambda: (get_trainjob(worker, namespace, "progress").get("status") or {})
               .get("conditions") or [],
               lambda conditions: any(x["type"] == "Created" for x in conditions),
               expected=f"TrainJob {namespace}/progress with its Created condition")

    code, answer = endpoint.post(path, {"trainerStatus": PROGRESS}, token)
    assert code == 200, answer
    assert answer == {"trainerStatus": PROGRESS}
    job = get_trainjob(worker, namespace, "progress")
    assert job["status"]["trainerStatus"] == PROGRESS
    assert any(x["type"] == "Created" for x in job["status"]["conditions"]), job["status"]
    fields = {m["manager"] for m in job["metadata"]["managedFields"]
              if m.get("subresource") == "status"}
    assert ts.FIELD_MANAGER in fields

    # The next report replaces the previous one: what it leaves out is gone.
    later = {"progressPercentage": 90, "lastUpdatedTime": "2025-06-01T12:30:00+02:00"}
    code, answer = endpoint.post(path, {"trainerStatus": later}, token)
    assert code == 200, answer
    assert trainer_status(worker, namespace, "progress") == {
        "progressPercentage": 90, "lastUpdatedTime": "2025-06-01T10:30:00Z"}

    # The operator's own status writes keep the trainer's report.
    worker.custom.patch_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "progress",
                                                 {"spec": {"suspend": True}})
    eventually(lambda: get_trainjob(worker, namespace, "progress")["status"],
               lambda status: any(x["type"] == c.CONDITION_SUSPENDED and x["status"] == "True"
                                  for x in status.get("conditions") or []),
               expected="the job suspended by the operator")
    assert trainer_status(worker, namespace, "progress")["progressPercentage"] == 90


def test_requests_without_the_jobs_token_are_refused(reporting, namespace):
    worker, endpoint = reporting
    create_trainjob(worker, namespace, "mine")
    create_trainjob(worker, namespace, "other")
    path, audience = wiring(trainer_pod_spec(worker, namespace, "mine"))
    _, other_audience = wiring(trainer_pod_spec(worker, namespace, "other"))
    body = {"trainerStatus": PROGRESS}

    code, answer = endpoint.post(path, body)
    assert code == 403, answer
    assert answer["reason"] == "Forbidden"
    assert f"TrainJob {namespace}/mine" in answer["message"]
    assert "Authorization header: no bearer token" in answer["message"]

    code, answer = endpoint.post(path, body, "not-a-token")
    assert code == 403 and "not valid for audience" in answer["message"], answer

    # A pod of another job: its token is for that job's audience.
    other = pod_token(worker, namespace, "other", other_audience)
    code, answer = endpoint.post(path, body, other)
    assert code == 403, answer
    assert f"not valid for audience {audience}" in answer["message"]

    # The right audience, but a service account of another namespace.
    elsewhere = f"{namespace}-x"[:63]
    worker.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=elsewhere)))
    try:
        worker.core.create_namespaced_service_account(
            elsewhere, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="intruder")))
        foreign = worker.core.create_namespaced_service_account_token(
            "intruder", elsewhere, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[audience]))).status.token
        code, answer = endpoint.post(path, body, foreign)
        assert code == 403, answer
        assert f"in namespace {elsewhere}, not in the TrainJob's namespace {namespace}" in \
            answer["message"]
    finally:
        worker.core.delete_namespace(elsewhere)

    # A token bound to a pod that is gone (the apiserver revokes it with its pod).
    pod = trainer_pod(worker, namespace, "mine")
    token = pod_token(worker, namespace, "mine", audience, pod)
    worker.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    eventually(lambda: [p.metadata.uid for p in worker.core.list_namespaced_pod(namespace).items],
               lambda uids: pod.metadata.uid not in uids, expected="the pod gone")
    code, answer = endpoint.post(path, body, token)
    assert code == 403 and "not valid for audience" in answer["message"], answer

    assert trainer_status(worker, namespace, "mine") is None
    assert trainer_status(worker, namespace, "other") is None


INVALID = [
    ({**PROGRESS, "progressPercentage": 150}, "trainerStatus.progressPercentage",
     "must be between 0 and 100"),
    ({**PROGRESS, "progressPercentage": "50"}, "trainerStatus.progressPercentage",
     "must be an integer"),
    ({**PROGRESS, "estimatedRemainingSeconds": -1}, "trainerStatus.estimatedRemainingSeconds",
     "must be between 0"),
    ({**PROGRESS, "metrics": [{"name": "loss", "value": "x" * 65}]},
     "trainerStatus.metrics[0].value", "must be 1 to 64 characters"),
    ({**PROGRESS, "metrics": [{"value": "1"}]}, "trainerStatus.metrics[0].name", "is required"),
    ({k: v for k, v in PROGRESS.items() if k != "lastUpdatedTime"},
     "trainerStatus.lastUpdatedTime", "is required"),
]


def test_invalid_progress_is_refused_naming_the_field(reporting, namespace):
    worker, endpoint = reporting
    create_trainjob(worker, namespace, "invalid")
    path, audience = wiring(trainer_pod_spec(worker, namespace, "invalid"))
    token = pod_token(worker, namespace, "invalid", audience)
    assert endpoint.post(path, {"trainerStatus": PROGRESS}, token)[0] == 200

    for trainer, field, reason in INVALID:
        code, answer = endpoint.post(path, {"trainerStatus": trainer}, token)
        assert code == 422, (field, answer)
        assert answer["reason"] == "Invalid"
        assert f"TrainJob {namespace}/invalid" in answer["message"]
        assert f"{field}: {reason}" in answer["message"], answer["message"]
        assert field in [cause["field"] for cause in answer["details"]["causes"]]
        # The operator may write its own status meanwhile; the trainer's report stays.
        assert trainer_status(worker, namespace, "invalid") == PROGRESS, field


def test_malformed_requests_change_nothing(reporting, namespace):
    worker, endpoint = reporting
    create_trainjob(worker, namespace, "malformed")
    path, audience = wiring(trainer_pod_spec(worker, namespace, "malformed"))
    token = pod_token(worker, namespace, "malformed", audience)

    code, answer = endpoint.post(path, None, token, raw=b"{not json")
    assert code == 422 and "the body is not JSON" in answer["message"], answer
    code, answer = endpoint.post(path, {}, token)
    assert (code, answer) == (200, {})  # nothing to report, nothing written (as upstream)
    code, answer = endpoint.post(path, None, token, raw=b"x" * (ts.MAX_BODY_BYTES + 1))
    assert code == 413, answer
    code, answer = endpoint.post(path.replace("/status", "/scale"), {}, token)
    assert code == 404, answer
    # A job that is not there.
    missing = path.replace("/malformed/", "/missing/")
    code, answer = endpoint.post(missing, {"trainerStatus": PROGRESS}, token)
    assert code == 403, answer  # the token is this job's, not the missing one's

    assert trainer_status(worker, namespace, "malformed") is None


def test_a_job_this_operator_does_not_manage_is_refused(reporting, namespace):
    worker, endpoint = reporting
    create_trainjob(worker, namespace, "foreign", managed_by=c.MANAGED_BY_MULTIKUEUE)
    audience = ts.token_audience(namespace, "foreign")
    token = worker.core.create_namespaced_service_account_token(
        SERVICE_ACCOUNT, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[audience]))).status.token
    code, answer = endpoint.post(ts.status_path(namespace, "foreign"),
                                 {"trainerStatus": PROGRESS}, token)
    assert code == 403, answer
    assert "spec.managedBy is 'kueue.x-k8s.io/multikueue'" in answer["message"]
    assert trainer_status(worker, namespace, "foreign") is None
    with pytest.raises(ApiException) as err:
        worker.core.read_namespaced_config_map("foreign-tls-config", namespace)
    assert err.value.status == 404


def test_the_crd_holds_trainer_status_with_upstreams_rules(multicluster, namespace):
    """The project's CRD keeps status.trainerStatus (no pruning) and refuses what upstream's
    refuses, whoever writes it."""
    worker = multicluster[WORKER]
    create_trainjob(worker, namespace, "schema", managed_by=c.MANAGED_BY_MULTIKUEUE)

    def write(trainer: dict) -> dict:
        return worker.custom.patch_namespaced_custom_object_status(
            *TRAINER, namespace, c.TRAINJOBS, "schema", {"status": {"trainerStatus": trainer}},
            _content_type="application/merge-patch+json")

    assert write(PROGRESS)["status"]["trainerStatus"] == PROGRESS
    for trainer, field in (({"progressPercentage": 101, "lastUpdatedTime": "2025-06-01T12:00:00Z"},
                            "status.trainerStatus.progressPercentage"),
                           ({"estimatedRemainingSeconds": -1,
                             "lastUpdatedTime": "2025-06-01T12:00:00Z"},
                            "status.trainerStatus.estimatedRemainingSeconds"),
                           ({"metrics": [{"name": "m", "value": ""}],
                             "lastUpdatedTime": "2025-06-01T12:00:00Z"},
                            "status.trainerStatus.metrics[0].value"),
                           ({"progressPercentage": 1, "lastUpdatedTime": None},
                            "status.trainerStatus")):
        with pytest.raises(ApiException) as err:
            write(trainer)
        assert err.value.status == 422, err.value.body
        assert field in err.value.body, err.value.body
    assert trainer_status(worker, namespace, "schema") == PROGRESS
