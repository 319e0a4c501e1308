"""The project's CRDs as real 1.34 API servers enforce them: managedBy, the TrainJob
schema and MultiKueue's objects."""

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.testing import eventually

TRAINER = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
OPERATOR = "kubeflow.org/training-operator"
UPSTREAM_OPERATOR = "trainer.kubeflow.org/trainjob-controller"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
NOT_ALLOWED = (
    "spec.managedBy must be one of kubeflow.org/training-operator, "
    "trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue"
)
CLUSTERS = ["manager", "worker-1"]
MERGE_PATCH = "application/merge-patch+json"


def trainjob(name: str, **spec) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


def create(cluster, namespace: str, body: dict) -> dict:
    return cluster.custom.create_namespaced_custom_object(*TRAINER[:2], namespace, TRAINER[2], body)


def get(cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(*TRAINER[:2], namespace, TRAINER[2], name)


def merge_patch(cluster, namespace: str, name: str, patch: dict) -> dict:
    return cluster.custom.patch_namespaced_custom_object(
        *TRAINER[:2], namespace, TRAINER[2], name, patch, _content_type=MERGE_PATCH)


def replace(cluster, namespace: str, body: dict) -> dict:
    return cluster.custom.replace_namespaced_custom_object(
        *TRAINER[:2], namespace, TRAINER[2], body["metadata"]["name"], body)


def rejected(call, *args) -> dict:
    """Run a request the server must refuse as invalid; return the parsed Status body."""
    with pytest.raises(ApiException) as info:
        call(*args)
    err = info.value
    assert err.status == 422, f"expected 422 Invalid, got {err.status}: {err.body}"
    return json.loads(err.body)


def assert_invalid(status: dict, field: str, message: str) -> None:
    """The refusal names ``field`` and carries ``message``, as a user (kubectl) sees it."""
    assert status["reason"] == "Invalid", status
    assert message in status["message"], status["message"]
    causes = [(c.get("field"), c.get("message", "")) for c in status["details"]["causes"]]
    assert any(f == field and message in m for f, m in causes), causes


def table(cluster, path: str) -> dict:
    """GET ``path`` as a meta.k8s.io Table: what ``kubectl get`` prints."""
    api = cluster.api
    method, url, headers, _, _ = api.param_serialize(
        "GET", path, header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    response = api.call_api(method, url, header_params=headers)
    response.read()
    assert response.status == 200, response.data
    return json.loads(response.data)


# --- TrainJob: acceptance and defaults -------------------------------------------------------


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_valid_trainjob_is_accepted_with_server_defaults_and_no_managed_by(
        multicluster, namespace, cluster_name):
    cluster = multicluster[cluster_name]
    override = {"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": "gpu"}}
    trainer = {"image": "ghcr.io/example/train:1", "numNodes": 2,
               "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}
    create(cluster, namespace, trainjob("valid", trainer=trainer, podSpecOverrides=[override]))

    spec = get(cluster, namespace, "valid")["spec"]
    assert spec["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert spec["suspend"] is False
    assert "managedBy" not in spec, f"managedBy must have no default, got {spec['managedBy']!r}"
    assert spec["trainer"] == trainer
    assert spec["podSpecOverrides"] == [override]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("managed_by", [OPERATOR, UPSTREAM_OPERATOR, MULTIKUEUE, ""],
                         ids=["operator", "upstream-operator", "multikueue", "empty"])
def test_allowed_managed_by_values_are_accepted_on_create(
        multicluster, namespace, cluster_name, managed_by):
    cluster = multicluster[cluster_name]
    create(cluster, namespace, trainjob("managed", managedBy=managed_by))
    assert get(cluster, namespace, "managed")["spec"]["managedBy"] == managed_by


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_unknown_managed_by_is_rejected_with_the_allowed_list(
        multicluster, namespace, cluster_name):
    cluster = multicluster[cluster_name]
    body = trainjob("stranger", managedBy="example.com/other")
    status = rejected(create, cluster, namespace, body)
    assert_invalid(status, "spec.managedBy", NOT_ALLOWED)

    with pytest.raises(ApiException) as info:
        get(cluster, namespace, "stranger")
    assert info.value.status == 404


# --- TrainJob: immutability ------------------------------------------------------------------

ABSENT = None  # spec.managedBy not set at all


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("method", ["merge-patch", "replace"])
@pytest.mark.parametrize("before, after", [
    (OPERATOR, MULTIKUEUE),
    (MULTIKUEUE, OPERATOR),
    (ABSENT, MULTIKUEUE),
    ("", MULTIKUEUE),
    (MULTIKUEUE, ABSENT),
    (OPERATOR, ABSENT),
    (UPSTREAM_OPERATOR, OPERATOR),
    (ABSENT, UPSTREAM_OPERATOR),
], ids=["operator-to-multikueue", "multikueue-to-operator", "unset-to-multikueue",
        "empty-to-multikueue", "multikueue-to-unset", "operator-to-unset",
        "upstream-operator-to-operator", "unset-to-upstream-operator"])
def test_managed_by_cannot_change(multicluster, namespace, cluster_name, method, before, after):
    cluster = multicluster[cluster_name]
    spec = {} if before is ABSENT else {"managedBy": before}
    create(cluster, namespace, trainjob("pinned", **spec))
    original = get(cluster, namespace, "pinned")

    if method == "merge-patch":
        # A JSON merge patch with null removes the field.
        status = rejected(merge_patch, cluster, namespace, "pinned", {"spec": {"managedBy": after}})
    else:
        body = get(cluster, namespace, "pinned")
        body["spec"].pop("managedBy", None)
        if after is not ABSENT:
            body["spec"]["managedBy"] = after
        status = rejected(replace, cluster, namespace, body)
    assert_invalid(status, "spec.managedBy", "spec.managedBy is immutable")

    now = get(cluster, namespace, "pinned")
    assert now["spec"] == original["spec"]
    assert now["metadata"]["resourceVersion"] == original["metadata"]["resourceVersion"]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("change", [{"name": "other-runtime"}, {"kind": "TrainingRuntime"}],
                         ids=["name", "kind"])
def test_runtime_ref_cannot_change(multicluster, namespace, cluster_name, change):
    cluster = multicluster[cluster_name]
    create(cluster, namespace, trainjob("pinned"))
    original = get(cluster, namespace, "pinned")

    status = rejected(merge_patch, cluster, namespace, "pinned", {"spec": {"runtimeRef": change}})
    assert_invalid(status, "spec.runtimeRef", "spec.runtimeRef is immutable")

    now = get(cluster, namespace, "pinned")
    assert now["spec"] == original["spec"]
    assert now["metadata"]["resourceVersion"] == original["metadata"]["resourceVersion"]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("managed_by", [ABSENT, MULTIKUEUE], ids=["unset", "multikueue"])
def test_other_spec_fields_stay_mutable(multicluster, namespace, cluster_name, managed_by):
    cluster = multicluster[cluster_name]
    spec = {"trainer": {"image": "train:1"}}
    if managed_by is not ABSENT:
        spec["managedBy"] = managed_by
    created = create(cluster, namespace, trainjob("mutable", **spec))

    merge_patch(cluster, namespace, "mutable",
                {"spec": {"suspend": True, "labels": {"example.com/stage": "2"}}})

    now = get(cluster, namespace, "mutable")
    assert now["spec"]["suspend"] is True
    assert now["spec"]["labels"] == {"example.com/stage": "2"}
    assert now["spec"].get("managedBy", ABSENT) == managed_by
    assert now["metadata"]["generation"] == created["metadata"]["generation"] + 1


# --- TrainJob and runtimes: quantities, counts, overrides of a running job -------------------

INT32_MAX = 2**31 - 1
QUANTITY = "must be a non-negative quantity"


def assert_unchanged_or_absent(cluster, namespace: str, name: str) -> None:
    with pytest.raises(ApiException) as info:
        get(cluster, namespace, name)
    assert info.value.status == 404, f"expected no TrainJob {name}, got HTTP {info.value.status}"


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("kind", ["requests", "limits"])
@pytest.mark.parametrize("resource, value", [
    ("cpu", "-1"), ("memory", "-1Ti"), ("cpu", -4), ("cpu", "abc"), ("memory", "1.5.0Gi")])
def test_negative_or_unparseable_quantities_are_refused(
        multicluster, namespace, cluster_name, kind, resource, value):
    cluster = multicluster[cluster_name]
    body = trainjob("bad-quantity", trainer={"resourcesPerNode": {kind: {resource: value}}})
    status = rejected(create, cluster, namespace, body)
    assert_invalid(status, f"spec.trainer.resourcesPerNode.{kind}[{resource}]", QUANTITY)
    assert "TrainJob.trainer.kubeflow.org \"bad-quantity\" is invalid" in status["message"]
    assert_unchanged_or_absent(cluster, namespace, "bad-quantity")


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_zero_and_exponent_quantities_are_accepted(multicluster, namespace, cluster_name):
    cluster = multicluster[cluster_name]
    requests = {"cpu": 0, "memory": "1e3", "nvidia.com/gpu": "0"}
    create(cluster, namespace, trainjob("zero", trainer={"resourcesPerNode": {
        "requests": requests, "limits": {"memory": "4Gi"}}}))
    assert get(cluster, namespace, "zero")["spec"]["trainer"]["resourcesPerNode"]["requests"] \
        == requests


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("field, trainer, message", [
    ("spec.trainer.numNodes", {"numNodes": 3_000_000_000},
     f"should be less than or equal to {INT32_MAX}"),
    ("spec.trainer.numProcPerNode", {"numProcPerNode": 3_000_000_000}, "int32"),
    ("spec.trainer.numProcPerNode", {"numProcPerNode": -2}, "must be a positive integer"),
], ids=["numNodes", "numProcPerNode-large", "numProcPerNode-negative"])
def test_counts_beyond_int32_or_below_one_are_refused(
        multicluster, namespace, cluster_name, field, trainer, message):
    cluster = multicluster[cluster_name]
    status = rejected(create, cluster, namespace, trainjob("huge", trainer=trainer))
    assert_invalid(status, field, message)
    assert_unchanged_or_absent(cluster, namespace, "huge")


@pytest.mark.parametrize("ml_policy, field, message", [
    ({"numNodes": INT32_MAX + 1}, "spec.mlPolicy.numNodes", str(INT32_MAX)),
    ({"torch": {"numProcPerNode": INT32_MAX + 1}}, "spec.mlPolicy.torch.numProcPerNode",
     "int32"),
    ({"mpi": {"numProcPerNode": INT32_MAX + 1}}, "spec.mlPolicy.mpi.numProcPerNode",
     str(INT32_MAX)),
], ids=["numNodes", "torch-numProcPerNode", "mpi-numProcPerNode"])
def test_runtime_counts_beyond_int32_are_refused(multicluster, ml_policy, field, message):
    custom = multicluster["worker-1"].custom
    name = "runtime-beyond-int32"
    status = rejected(custom.create_cluster_custom_object, TRAINER[0], TRAINER[1],
                      "clustertrainingruntimes", {
                          "apiVersion": "trainer.kubeflow.org/v1alpha1",
                          "kind": "ClusterTrainingRuntime", "metadata": {"name": name},
                          "spec": {"mlPolicy": ml_policy}})
    assert_invalid(status, field, message)
    with pytest.raises(ApiException) as info:
        custom.get_cluster_custom_object(TRAINER[0], TRAINER[1], "clustertrainingruntimes", name)
    assert info.value.status == 404


OVERRIDE = [{"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": "a"}}]
INJECTED = [{"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": "b"}}]
NOT_WHILE_RUNNING = "may change only while the TrainJob is suspended"


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("managed_by", [ABSENT, MULTIKUEUE], ids=["unset", "multikueue"])
@pytest.mark.parametrize("after", [INJECTED, ABSENT], ids=["changed", "removed"])
def test_overrides_of_a_running_job_cannot_change(
        multicluster, namespace, cluster_name, managed_by, after):
    cluster = multicluster[cluster_name]
    spec = {"podSpecOverrides": OVERRIDE}
    if managed_by is not ABSENT:
        spec["managedBy"] = managed_by
    create(cluster, namespace, trainjob("running", **spec))
    original = get(cluster, namespace, "running")

    status = rejected(merge_patch, cluster, namespace, "running",
                      {"spec": {"podSpecOverrides": after}})
    assert_invalid(status, "spec.podSpecOverrides", NOT_WHILE_RUNNING)
    assert status["details"]["causes"][0]["reason"] == "FieldValueForbidden", status

    now = get(cluster, namespace, "running")
    assert now["metadata"]["resourceVersion"] == original["metadata"]["resourceVersion"]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("created_suspended, patch", [
    (True, {"podSpecOverrides": INJECTED}),
    # A queue injects its constraints and resumes the job in one request.
    (True, {"podSpecOverrides": INJECTED, "suspend": False}),
    (False, {"podSpecOverrides": INJECTED, "suspend": True}),
], ids=["while-suspended", "resumed-in-the-same-update", "suspended-in-the-same-update"])
def test_overrides_change_when_the_job_is_suspended_before_or_after(
        multicluster, namespace, cluster_name, created_suspended, patch):
    cluster = multicluster[cluster_name]
    create(cluster, namespace, trainjob("queued", suspend=created_suspended,
                                        podSpecOverrides=OVERRIDE))
    merge_patch(cluster, namespace, "queued", {"spec": patch})
    assert get(cluster, namespace, "queued")["spec"]["podSpecOverrides"] == INJECTED


# --- TrainJob: status subresource and printer columns ----------------------------------------


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_trainjob_status_is_written_only_through_the_status_subresource(
        multicluster, namespace, cluster_name):
    cluster = multicluster[cluster_name]
    custom = cluster.custom
    suspended = {"type": "Suspended", "status": "True", "reason": "Suspended",
                 "message": "suspended by the user", "lastTransitionTime": "2025-01-01T00:00:00Z"}
    forged = {"conditions": [{"type": "Complete", "status": "True", "reason": "Forged"}]}

    created = create(cluster, namespace, {**trainjob("observed"), "status": forged})
    assert "status" not in created, "create must drop .status when the status subresource is on"

    merge_patch(cluster, namespace, "observed", {"status": forged})
    assert "status" not in get(cluster, namespace, "observed")

    custom.patch_namespaced_custom_object_status(
        *TRAINER[:2], namespace, TRAINER[2], "observed",
        {"status": {"conditions": [suspended],
                    "jobsStatus": [{"name": "node", "active": 0, "suspended": 2}]},
         "spec": {"suspend": True}},
        _content_type=MERGE_PATCH)
    now = get(cluster, namespace, "observed")
    assert now["status"] == {"conditions": [suspended],
                             "jobsStatus": [{"name": "node", "active": 0, "suspended": 2}]}
    assert now["spec"]["suspend"] is False, "the status endpoint must not write spec"

    merge_patch(cluster, namespace, "observed", {"status": forged})
    assert get(cluster, namespace, "observed")["status"]["conditions"] == [suspended]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_trainjob_printer_columns_show_state_and_age(multicluster, namespace, cluster_name):
    cluster = multicluster[cluster_name]
    crd = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(
        "trainjobs.trainer.kubeflow.org")
    version = next(v for v in crd.spec.versions if v.name == "v1alpha1")
    columns = {c.name: (c.type, c.json_path) for c in version.additional_printer_columns}
    assert columns == {
        "State": ("string", ".status.conditions[-1:].type"),
        "Worker": ("string", ".metadata.annotations.trainjob-dispatcher\\.io/cluster"),
        "Age": ("date", ".metadata.creationTimestamp"),
    }

    # The server renders State from the most recent condition and Worker from the
    # dispatcher's placement, as `kubectl get` would show them.
    body = trainjob("shown")
    body["metadata"]["annotations"] = {"trainjob-dispatcher.io/cluster": "worker-7"}
    create(cluster, namespace, body)
    cluster.custom.patch_namespaced_custom_object_status(
        *TRAINER[:2], namespace, TRAINER[2], "shown",
        {"status": {"conditions": [
            {"type": "Suspended", "status": "False", "reason": "Resumed"},
            {"type": "Complete", "status": "True", "reason": "JobSetCompleted"},
        ]}}, _content_type=MERGE_PATCH)
    rendered = table(
        cluster, f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/shown")
    names = [c["name"] for c in rendered["columnDefinitions"]]
    assert names == ["Name", "State", "Worker", "Age"]
    assert rendered["rows"][0]["cells"][:3] == ["shown", "Complete", "worker-7"]


# --- MultiKueue registration (manager only) --------------------------------------------------


def test_multikueue_cluster_and_config_on_the_manager(multicluster, namespace):
    custom = multicluster.manager.custom
    accepted_name, config_name = f"{namespace}-w1", f"{namespace}-cfg"
    created = []
    try:
        custom.create_cluster_custom_object(*KUEUE, "multikueueclusters", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
            "metadata": {"name": accepted_name},
            "spec": {"clusterSource": {"kubeConfig": {"location": "worker-1-secret"}}},
        })
        created.append(("multikueueclusters", accepted_name))
        stored = custom.get_cluster_custom_object(*KUEUE, "multikueueclusters", accepted_name)
        assert stored["spec"]["clusterSource"]["kubeConfig"] == {
            "location": "worker-1-secret", "locationType": "Secret"}

        status = rejected(custom.create_cluster_custom_object, *KUEUE, "multikueueclusters", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
            "metadata": {"name": f"{namespace}-other"},
            "spec": {"clusterSource": {"kubeConfig": {"location": "x", "locationType": "Other"}}},
        })
        assert_invalid(
            status, "spec.clusterSource.kubeConfig.locationType", 'Unsupported value: "Other"')

        # Kueue's rule: a kubeConfig or a clusterProfileRef, exactly one.
        both = {"kubeConfig": {"location": "x"}, "clusterProfileRef": {"name": "x"}}
        for source in (both, {}):
            status = rejected(custom.create_cluster_custom_object, *KUEUE,
                              "multikueueclusters", {
                                  "apiVersion": "kueue.x-k8s.io/v1beta2",
                                  "kind": "MultiKueueCluster",
                                  "metadata": {"name": f"{namespace}-sources"},
                                  "spec": {"clusterSource": source}})
            assert_invalid(status, "spec.clusterSource",
                           "exactly one of the fields in [kubeConfig clusterProfileRef]")
        # A MultiKueueConfig names each cluster once.
        status = rejected(custom.create_cluster_custom_object, *KUEUE, "multikueueconfigs", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig",
            "metadata": {"name": f"{namespace}-twice"}, "spec": {"clusters": ["a", "b", "a"]},
        })
        assert_invalid(status, "spec.clusters", "must be unique")

        custom.create_cluster_custom_object(*KUEUE, "multikueueconfigs", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig",
            "metadata": {"name": config_name}, "spec": {"clusters": ["a", "b"]},
        })
        created.append(("multikueueconfigs", config_name))
        stored = custom.get_cluster_custom_object(*KUEUE, "multikueueconfigs", config_name)
        assert stored["spec"]["clusters"] == ["a", "b"]
    finally:
        for plural, name in created:
            custom.delete_cluster_custom_object(*KUEUE, plural, name)


# --- JobSet ----------------------------------------------------------------------------------


def test_workers_serve_upstream_jobsets_through_its_webhooks_and_controller(
        multicluster, namespace):
    """A worker has JobSet's own CRD, webhooks and controller: the JobSet is defaulted by the
    mutating webhook, an invalid one is refused by the validating webhook, and the
    controller creates its Jobs and writes its status."""
    custom = multicluster["worker-1"].custom
    template = {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "node", "image": "busybox", "command": ["true"]}]}}}}
    custom.create_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [{"name": "node", "template": template}]},
    })
    stored = custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], "js")
    # Defaults that only JobSet's own webhook sets.
    assert stored["spec"]["successPolicy"] == {"operator": "All"}
    assert stored["spec"]["network"]["enableDNSHostnames"] is True

    eventually(lambda: custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2],
                                                           "js").get("status") or {},
               lambda status: [r["name"] for r in status.get("replicatedJobsStatus") or []]
               == ["node"],
               expected="the JobSet controller writing replicatedJobsStatus for js")
    jobs = client.BatchV1Api(multicluster["worker-1"].api).list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs] == ["js-node-0"]

    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "twice"},
            "spec": {"replicatedJobs": [{"name": "node", "template": template},
                                        {"name": "node", "template": template}]},
        })
    assert refused.value.status in (400, 422)
    assert "node" in json.loads(refused.value.body)["message"]


def test_the_manager_has_no_jobsets(multicluster):
    names = {crd.metadata.name for crd in client.ApiextensionsV1Api(
        multicluster.manager.api).list_custom_resource_definition().items}
    assert "jobsets.jobset.x-k8s.io" not in names

