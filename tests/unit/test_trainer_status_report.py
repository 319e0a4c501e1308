"""Unit tests of the pure parts of trainer progress reports: names, request reading and
validation (``trainjob.trainer_status``) and the pod wiring plug-in."""

from __future__ import annotations

from typing import Any

import pytest

from controller_kit.metrics_auth import bearer_token
from trainjob import constants as c
from trainjob import trainer_status as ts
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info
from trainjob.runtime.plugins import registered
from trainjob.runtime.plugins.trainer_status import TrainerStatusPlugin

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_names_are_upstreams():
    assert ts.token_audience("team", "llm") == \
        "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm/status"
    assert ts.status_path("team", "llm") == \
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm/status"
    assert ts.parse_status_path(ts.status_path("team", "llm")) == ("team", "llm")
    for other in ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm",
                  "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm/scale",
                  "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/b/trainjobs/llm/status",
                  "/healthz"):
        assert ts.parse_status_path(other) is None, other


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("  BEARER \t abc  ", "abc"),
    (None, ""), ("", ""), ("Bearer", ""), ("Basic abc", ""), ("Bearer a b", ""),
])
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def test_a_full_report_is_read_as_written_with_time_in_utc_seconds():
    body = {"trainerStatus": {
        "progressPercentage": 0, "estimatedRemainingSeconds": 2**31 - 1,
        "metrics": [{"name": "loss", "value": "0.1", "unit": "ignored"}],
        "lastUpdatedTime": "2025-01-31T12:00:00.75+02:00", "future": "ignored"}}
    assert ts.trainer_status_from_request(body) == {
        "progressPercentage": 0, "estimatedRemainingSeconds": 2**31 - 1,
        "metrics": [{"name": "loss", "value": "0.1"}],
        "lastUpdatedTime": "2025-01-31T10:00:00Z"}


def test_no_trainer_status_means_nothing_to_write():
    assert ts.trainer_status_from_request({}) is None
    assert ts.trainer_status_from_request({"trainerStatus": None}) is None


@pytest.mark.parametrize(("body", "field", "reason"), [
    ([], "(body)", "must be a JSON object"),
    ({"trainerStatus": 5}, "trainerStatus", "must be an object"),
    ({"trainerStatus": {"progressPercentage": 101}}, "trainerStatus.progressPercentage",
     "must be between 0 and 100, not 101"),
    ({"trainerStatus": {"progressPercentage": -1}}, "trainerStatus.progressPercentage",
     "must be between 0 and 100"),
    ({"trainerStatus": {"progressPercentage": True}}, "trainerStatus.progressPercentage",
     "must be an integer, not a boolean"),
    ({"trainerStatus": {"progressPercentage": 5.0}}, "trainerStatus.progressPercentage",
     "must be an integer, not the number 5.0"),
    ({"trainerStatus": {"estimatedRemainingSeconds": 2**31}},
     "trainerStatus.estimatedRemainingSeconds", "must be between 0 and 2147483647"),
    ({"trainerStatus": {"metrics": {}}}, "trainerStatus.metrics", "must be a list"),
    ({"trainerStatus": {"metrics": [{"name": "m", "value": "v"}] * 257}},
     "trainerStatus.metrics", "at most 256 items"),
    ({"trainerStatus": {"metrics": ["loss"]}}, "trainerStatus.metrics[0]", "must be an object"),
    ({"trainerStatus": {"metrics": [{"name": "", "value": "1"}]}},
     "trainerStatus.metrics[0].name", "must be 1 to 64 characters"),
    ({"trainerStatus": {"metrics": [{"name": "loss", "value": 0.1}]}},
     "trainerStatus.metrics[0].value", "must be a string"),
    ({"trainerStatus": {"progressPercentage": 5}}, "trainerStatus.lastUpdatedTime",
     "is required"),
    ({"trainerStatus": {"lastUpdatedTime": "2025-01-31T12:00:00"}},
     "trainerStatus.lastUpdatedTime", "with a zone"),
    ({"trainerStatus": {"lastUpdatedTime": "2025-01-31"}}, "trainerStatus.lastUpdatedTime",
     "RFC 3339"),
    ({"trainerStatus": {"lastUpdatedTime": 1738324800}}, "trainerStatus.lastUpdatedTime",
     "must be an RFC 3339 time string"),
])
def test_invalid_reports_name_the_field(body, field, reason):
    with pytest.raises(ts.InvalidUpdate) as err:
        ts.trainer_status_from_request(body)
    assert any(f == field and reason in r for f, r in err.value.problems), err.value.problems
    assert f"{field}: " in str(err.value)


def test_every_problem_is_named_at_once():
    with pytest.raises(ts.InvalidUpdate) as err:
        ts.trainer_status_from_request({"trainerStatus": {
            "progressPercentage": 200, "metrics": [{"name": "x" * 65, "value": "1"}]}})
    assert [f for f, _ in err.value.problems] == [
        "trainerStatus.progressPercentage", "trainerStatus.metrics[0].name",
        "trainerStatus.lastUpdatedTime"]


def test_apply_body_carries_only_the_trainer_status():
    assert ts.apply_body("team", "llm", {"lastUpdatedTime": "2025-01-31T10:00:00Z"}) == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "llm", "namespace": "team"},
        "status": {"trainerStatus": {"lastUpdatedTime": "2025-01-31T10:00:00Z"}}}


# ---------------------------------------------------------------- the plug-in


def _job(name: str, role: str, containers: list[str], volumes: list | None = None) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": n, "image": "x"} for n in containers]}
    if volumes:
        spec["volumes"] = volumes
    return {"name": name, "template": {"metadata": {"labels": {c.ANCESTOR_LABEL: role}},
                                       "spec": {"template": {"spec": spec}}}}


def _runtime(jobs: list[dict]) -> TrainingRuntime:
    return TrainingRuntime.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": "rt"},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {
            "replicatedJobs": jobs}}}})


def _trainjob(env: list[dict] | None = None) -> TrainJob:
    spec: dict[str, Any] = {"runtimeRef": {"name": "rt"}}
    if env:
        spec["trainer"] = {"env": env}
    return TrainJob.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "llm", "namespace": "team", "uid": "u-1"}, "spec": spec})


PLUGIN = TrainerStatusPlugin("https://status.example:10443/", lambda: CA)
WIRED_ENV = [
    {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "https://status.example:10443/apis/"
     "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm/status"},
    {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT",
     "value": "/var/run/secrets/kubeflow/trainer/ca.crt"},
    {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": "/var/run/secrets/kubeflow/trainer/token"},
]
WIRED_VOLUME = {"name": "kubeflow-trainer-token", "projected": {"sources": [
    {"serviceAccountToken": {
        "audience": "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llm/status",
        "expirationSeconds": 3600, "path": "token"}},
    {"configMap": {"name": "llm-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
]}}
WIRED_MOUNT = {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer",
               "readOnly": True}


def test_every_trainer_container_is_wired_and_nothing_else():
    runtime = _runtime([_job(c.DATASET_INITIALIZER, c.ROLE_DATASET_INITIALIZER, ["init"]),
                        _job(c.NODE, c.ROLE_TRAINER, [c.NODE, "sidecar"])])
    info = build_runtime_info(_trainjob(), runtime, registered() + [PLUGIN])
    node = info.pod_set(c.NODE)
    for container in node.containers:
        wired = [e for e in container["env"] if e["name"].startswith("KUBEFLOW_TRAINER_")]
        assert wired == WIRED_ENV, container["name"]
        assert container["volumeMounts"] == [WIRED_MOUNT]
    assert node.volumes == [WIRED_VOLUME]
    initializer = info.pod_set(c.DATASET_INITIALIZER)
    assert "env" not in initializer.containers[0] and not initializer.pod_spec.get("volumes")
    (configmap,) = [o for o in info.objects if o.body["kind"] == "ConfigMap"]
    assert configmap.body == {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "llm-tls-config", "namespace": "team"},
                              "data": {"ca.crt": CA}}
    assert not configmap.create_only  # applied on every build: a rotated CA reaches it


def test_the_plugin_replaces_what_a_template_or_job_set_under_its_names():
    runtime = _runtime([_job(c.NODE, c.ROLE_TRAINER, [c.NODE],
                             volumes=[{"name": "kubeflow-trainer-token", "emptyDir": {}}])])
    runtime.spec.template.spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["volumeMounts"] = [
            {"name": "mine", "mountPath": "/var/run/secrets/kubeflow/trainer"}]
    job = _trainjob(env=[{"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "http://mine"}])
    info = build_runtime_info(job, runtime, registered() + [PLUGIN])
    container = info.pod_set(c.NODE).container(c.NODE)
    assert [e for e in container["env"] if e["name"] == "KUBEFLOW_TRAINER_SERVER_URL"] == \
        WIRED_ENV[:1]
    assert container["volumeMounts"] == [WIRED_MOUNT]
    assert info.pod_set(c.NODE).volumes == [WIRED_VOLUME]


def test_without_the_plugin_nothing_is_wired():
    runtime = _runtime([_job(c.NODE, c.ROLE_TRAINER, [c.NODE])])
    info = build_runtime_info(_trainjob(), runtime)
    container = info.pod_set(c.NODE).container(c.NODE)
    assert not [e for e in container.get("env") or [] if e["name"].startswith("KUBEFLOW_TRAINER_")]
    assert not info.pod_set(c.NODE).pod_spec.get("volumes")
    assert not [o for o in info.objects if o.body["kind"] == "ConfigMap"]
    assert PLUGIN not in registered()


def test_only_the_first_trainer_pod_set_is_wired():
    runtime = _runtime([_job("node", c.ROLE_TRAINER, [c.NODE]),
                        _job("node-b", c.ROLE_TRAINER, [c.NODE])])
    info = build_runtime_info(_trainjob(), runtime, registered() + [PLUGIN])
    assert info.pod_set("node").volumes == [WIRED_VOLUME]
    assert not info.pod_set("node-b").pod_spec.get("volumes")


# ---------------------------------------------------------------- the command line


def test_the_endpoint_needs_the_webhook_certificate(capsys, tmp_path):
    from training_operator import cli

    assert cli.main(["run", "--enable-trainer-status"]) == 2
    assert "--enable-trainer-status needs --webhook-cert-dir" in capsys.readouterr().err
    assert cli.main(["run", "--enable-trainer-status", "--webhook-cert-dir",
                     str(tmp_path)]) == 2
    assert f"--trainer-status-ca-file {tmp_path / 'ca.crt'}: no such file" in \
        capsys.readouterr().err


def test_help_says_it_is_off_by_default():
    from training_operator import cli

    text = cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "--enable-trainer-status" in text
    assert "off by default" in text
