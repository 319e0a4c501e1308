"""``review()``, the admission rules as a pure function: TrainJobs (managedBy, names,
overrides and runtime patches against the runtime, mutability) and runtimes.

The lookups here are an in-memory table of runtimes and JobSets; what the real apiserver does
with the answers is proven in tests/operator/test_webhook.py.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import time

import pytest

from training_operator.webhook import review, review_json

OPERATOR = "kubeflow.org/training-operator"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
NS = "team-a"


def replicated_job(name: str, init_containers: tuple[str, ...] = ()) -> dict:
    pod = {"containers": [{"name": name, "image": f"example.com/{name}:1"}]}
    if name.endswith("-initializer"):  # upstream's layout: the shared volume mounted
        pod["containers"][0]["volumeMounts"] = [{"name": "initializer", "mountPath": "/workspace"}]
    if init_containers:
        pod["initContainers"] = [{"name": n, "image": "busybox"} for n in init_containers]
    return {"name": name, "template": {"spec": {"template": {"spec": pod}}}}


def runtime(name: str, jobs: list[dict], kind: str = "ClusterTrainingRuntime",
            ml_policy: dict | None = None) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind,
        "metadata": {"name": name},
        "spec": {"mlPolicy": ml_policy if ml_policy is not None else {"torch": {}},
                 "template": {"spec": {"replicatedJobs": jobs}}},
    }


TORCH = runtime("torch", [replicated_job("dataset-initializer"),
                          replicated_job("model-initializer"),
                          replicated_job("node", init_containers=("prepare",))])
PLAIN = runtime("plain", [replicated_job("node")], ml_policy={})
LOCAL = runtime("local", [replicated_job("node")], kind="TrainingRuntime")


class TableLookups:
    """Runtimes and JobSets from dicts (no API at all)."""

    def __init__(self, jobsets: dict[tuple[str, str], dict] | None = None):
        self.runtimes = {
            ("ClusterTrainingRuntime", "", "torch"): TORCH,
            ("ClusterTrainingRuntime", "", "plain"): PLAIN,
            ("TrainingRuntime", NS, "local"): LOCAL,
        }
        self.jobsets = jobsets or {}
        self.priorities: set[str] = set()
        self.calls: list[tuple] = []

    def runtime(self, namespace: str, kind: str, name: str) -> dict | None:
        self.calls.append(("runtime", namespace, kind, name))
        scope = namespace if kind == "TrainingRuntime" else ""
        return self.runtimes.get((kind, scope, name))

    def jobset(self, namespace: str, name: str) -> dict | None:
        self.calls.append(("jobset", namespace, name))
        return self.jobsets.get((namespace, name))

    def priority_class(self, name: str) -> dict | None:
        self.calls.append(("priority_class", name))
        return {"metadata": {"name": name}, "value": 1000} if name in self.priorities else None


def trainjob(name: str = "job", **spec) -> dict:
    spec.setdefault("runtimeRef", {"name": "torch", "apiGroup": "trainer.kubeflow.org",
                                   "kind": "ClusterTrainingRuntime"})
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def admission(obj: dict, old: dict | None = None, uid: str = "7d2c-uid") -> dict:
    request = {
        "uid": uid,
        "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
        "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1",
                     "resource": "trainjobs"},
        "name": obj["metadata"].get("name", ""), "namespace": NS,
        "operation": "CREATE" if old is None else "UPDATE",
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def assert_well_formed(result: object, uid: str = "") -> None:
    assert isinstance(result, dict), result
    assert result["apiVersion"] == "admission.k8s.io/v1"
    assert result["kind"] == "AdmissionReview"
    response = result["response"]
    assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        status = response["status"]
        assert status["status"] == "Failure"
        assert status["code"] in (400, 403, 422, 500), status
        assert isinstance(status["reason"], str) and status["reason"]
        assert isinstance(status["message"], str) and status["message"]
    json.dumps(result)  # the server sends it as JSON


def allowed(obj: dict, old: dict | None = None, lookups: TableLookups | None = None) -> None:
    result = review(admission(obj, old), lookups or TableLookups())
    assert_well_formed(result, "7d2c-uid")
    assert result["response"]["allowed"], result["response"].get("status")


def refused(obj: dict, old: dict | None = None, lookups: TableLookups | None = None,
            code: int = 422) -> dict:
    """The refusal's status; checks the code and that it names the object."""
    result = review(admission(obj, old), lookups or TableLookups())
    assert_well_formed(result, "7d2c-uid")
    response = result["response"]
    assert not response["allowed"], "expected a refusal"
    status = response["status"]
    assert status["code"] == code, status
    assert status["reason"] == {403: "Forbidden", 422: "Invalid", 400: "BadRequest"}[code]
    if code != 400:
        assert status["message"].startswith(f"TrainJob {NS}/{obj['metadata']['name']}: "), status
    return status


def fields(status: dict) -> list[str]:
    return [cause["field"] for cause in status["details"]["causes"]]


def causes_of(status: dict) -> list[tuple[str, str]]:
    """(field, reason) of each cause: what a refusal means, as upstream's would."""
    return [(cause["field"], cause["reason"]) for cause in status["details"]["causes"]]


# --- create --------------------------------------------------------------------------------


def test_a_valid_create_is_allowed_and_echoes_the_uid():
    job = trainjob(
        trainer={"numNodes": 4, "numProcPerNode": 8, "env": [{"name": "NCCL_DEBUG",
                                                                  "value": "INFO"}]},
        initializer={"dataset": {"storageUri": "hf://d"}, "model": {"storageUri": "hf://m"}},
        podSpecOverrides=[{"targetJobs": [{"name": "node"}, {"name": "model-initializer"}],
                           "nodeSelector": {"pool": "a100"}},
                          {"targetJobs": [{"name": "node"}],
                           "containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}],
                           "initContainers": [{"name": "prepare"}]}],
    )
    lookups = TableLookups()
    allowed(job, lookups=lookups)
    assert lookups.calls == [("runtime", NS, "ClusterTrainingRuntime", "torch")]


@pytest.mark.parametrize("value", [None, "", OPERATOR, "trainer.kubeflow.org/trainjob-controller",
                                   MULTIKUEUE])
def test_allowed_managed_by_values(value):
    spec = {} if value is None else {"managedBy": value}
    allowed(trainjob(**spec))


@pytest.mark.parametrize("value", ["example.com/other", "Kubeflow.org/training-operator", 7])
def test_unknown_managed_by_is_invalid(value):
    status = refused(trainjob(managedBy=value))
    assert fields(status) == ["spec.managedBy"]
    assert ("must be one of kubeflow.org/training-operator, "
            "trainer.kubeflow.org/trainjob-controller, kueue.x-k8s.io/multikueue") \
        in status["message"]


@pytest.mark.parametrize("name", ["a", "job-1", "x" * 33])
def test_dns1035_names_are_allowed(name):
    allowed(trainjob(name))


def test_a_dns1035_name_is_refused_when_a_child_name_would_not_fit():
    # 63 characters make a valid label, but not with -dataset-initializer-0-0-<5 random>
    # after it (every job states its completions, so its pods are named by index).
    status = refused(trainjob("x" * 63))
    assert fields(status) == ["metadata.name"]
    assert "at most 33 fit" in status["message"], status["message"]


@pytest.mark.parametrize("name", ["1st-job", "my.job", "Job", "job-", "-job", "x" * 64, "a_b"])
def test_names_that_are_not_dns1035_labels_are_invalid(name):
    status = refused(trainjob(name))
    assert fields(status) == ["metadata.name"]
    assert "DNS-1035" in status["message"]


def test_a_generated_name_is_not_judged_before_it_exists():
    job = trainjob("")
    job["metadata"] = {"generateName": "job-", "namespace": NS}
    result = review(admission(job), TableLookups())
    assert result["response"]["allowed"], result


@pytest.mark.parametrize("kind, name", [("ClusterTrainingRuntime", "missing"),
                                        ("TrainingRuntime", "torch"),  # only cluster-scoped
                                        ("TrainingRuntime", "missing")])
def test_a_missing_runtime_is_invalid(kind, name):
    status = refused(trainjob(runtimeRef={"name": name, "kind": kind}))
    assert fields(status) == ["spec.runtimeRef"]
    where = f"TrainingRuntime {NS}/{name}" if kind == "TrainingRuntime" \
        else f"ClusterTrainingRuntime {name}"
    assert f"{where} not found" in status["message"]


def test_a_namespaced_runtime_is_found_in_the_jobs_namespace():
    allowed(trainjob(runtimeRef={"name": "local", "kind": "TrainingRuntime"}))
    other = trainjob(runtimeRef={"name": "local", "kind": "TrainingRuntime"})
    other["metadata"]["namespace"] = "team-b"
    result = review(admission(other), TableLookups())
    assert not result["response"]["allowed"]
    assert "TrainingRuntime team-b/local not found" in result["response"]["status"]["message"]


def test_a_multikueue_job_skips_the_runtime_checks_but_not_the_others():
    lookups = TableLookups()
    job = trainjob(managedBy=MULTIKUEUE, runtimeRef={"name": "only-on-workers"},
                   podSpecOverrides=[{"targetJobs": [{"name": "not-here"}]}])
    allowed(job, lookups=lookups)
    assert lookups.calls == [], "a MultiKueue job's runtime lives on a worker"

    status = refused(trainjob("1bad", managedBy=MULTIKUEUE, trainer={"numProcPerNode": "tpu"},
                              runtimeRef={"name": "only-on-workers"}))
    assert fields(status) == ["metadata.name", "spec.trainer.numProcPerNode"]


def test_unknown_and_duplicate_target_jobs_are_invalid():
    status = refused(trainjob(podSpecOverrides=[
        {"targetJobs": [{"name": "node"}, {"name": "launcher"}, {"name": "node"}]},
    ]))
    assert fields(status) == ["spec.podSpecOverrides[0].targetJobs[1].name",
                              "spec.podSpecOverrides[0].targetJobs[2].name"]
    causes = status["details"]["causes"]
    assert 'replicated job "launcher" not found in ClusterTrainingRuntime torch' \
           in causes[0]["message"]
    assert "dataset-initializer, model-initializer, node" in causes[0]["message"]
    assert 'duplicate replicated job "node"' in causes[1]["message"]


def test_the_same_job_in_two_overrides_is_fine():
    allowed(trainjob(podSpecOverrides=[{"targetJobs": [{"name": "node"}]},
                                       {"targetJobs": [{"name": "node"}]}]))


def test_unknown_override_containers_are_invalid():
    status = refused(trainjob(podSpecOverrides=[{
        "targetJobs": [{"name": "node"}, {"name": "dataset-initializer"}],
        "containers": [{"name": "node"}, {"name": "sidecar"}],
        "initContainers": [{"name": "prepare"}],
    }]))
    messages = {c["field"]: c["message"] for c in status["details"]["causes"]}
    # "node" is a container of node but not of dataset-initializer; "prepare" likewise.
    assert set(messages) == {"spec.podSpecOverrides[0].containers[0].name",
                             "spec.podSpecOverrides[0].containers[1].name",
                             "spec.podSpecOverrides[0].initContainers[0].name"}
    assert 'container "sidecar" not found in replicated job "node"' in status["message"]
    assert 'container "node" not found in replicated job "dataset-initializer"' \
           in status["message"]
    assert 'init container "prepare" not found in replicated job "dataset-initializer"' \
           in status["message"]


@pytest.mark.parametrize("nodes", [0, -1, "3", True, 1.5])
def test_num_nodes_below_one_or_not_an_integer_is_invalid(nodes):
    status = refused(trainjob(trainer={"numNodes": nodes}))
    assert fields(status) == ["spec.trainer.numNodes"]


@pytest.mark.parametrize("value", ["auto", "cpu", "gpu", 1, 8, "4"])
def test_num_proc_per_node_words_and_positive_integers_are_allowed(value):
    allowed(trainjob(trainer={"numProcPerNode": value}))


@pytest.mark.parametrize("value", ["tpu", "", 0, -2, "0", "²", True, 2.5, "Auto"])
def test_other_num_proc_per_node_values_are_invalid(value):
    status = refused(trainjob(trainer={"numProcPerNode": value}))
    assert fields(status) == ["spec.trainer.numProcPerNode"], "said once, not once per layer"
    assert "must be auto, cpu, gpu or a positive integer" in status["message"]


@pytest.mark.parametrize("which", ["dataset", "model"])
def test_an_initializer_the_runtime_cannot_run_is_invalid(which):
    status = refused(trainjob(runtimeRef={"name": "plain"},
                              initializer={which: {"storageUri": "s3://x"}}))
    # Upstream refuses the reference to a runtime that cannot run the initializer.
    assert fields(status) == ["spec.runtimeRef"]
    assert causes_of(status) == [("spec.runtimeRef", "FieldValueInvalid")]
    assert f"has no {which}-initializer replicated job" in status["message"]


def test_an_initializer_job_is_found_by_its_name_not_its_ancestor_label():
    # Upstream looks the job up by name: a labelled job of another name does not run it.
    job = replicated_job("fetch-data")
    job["template"]["metadata"] = {
        "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}}
    lookups = TableLookups()
    lookups.runtimes[("ClusterTrainingRuntime", "", "labelled")] = runtime(
        "labelled", [job, replicated_job("node")])
    status = refused(trainjob(runtimeRef={"name": "labelled"}, initializer={"dataset": {}}),
                     lookups=lookups)
    assert fields(status) == ["spec.runtimeRef"]


def test_an_initializer_job_without_its_container_is_refused():
    job = replicated_job("dataset-initializer")
    job["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    lookups = TableLookups()
    lookups.runtimes[("ClusterTrainingRuntime", "", "renamed")] = runtime(
        "renamed", [job, replicated_job("node")])
    status = refused(trainjob(runtimeRef={"name": "renamed"},
                              initializer={"dataset": {"storageUri": "hf://d"}}),
                     lookups=lookups)
    assert causes_of(status) == [("spec.runtimeRef", "FieldValueInvalid")]
    assert "the dataset-initializer job has no container dataset-initializer" \
           in status["message"], status["message"]


def test_an_initializer_container_without_the_shared_volume_is_refused():
    # Upstream's example 05 defines such a runtime, and upstream refuses its TrainJob.
    job = replicated_job("dataset-initializer")
    del job["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    lookups = TableLookups()
    lookups.runtimes[("ClusterTrainingRuntime", "", "unmounted")] = runtime(
        "unmounted", [job, replicated_job("node")])
    status = refused(trainjob(runtimeRef={"name": "unmounted"},
                              initializer={"dataset": {"storageUri": "hf://d"}}),
                     lookups=lookups)
    assert fields(status) == ["spec.runtimeRef"]
    assert ("container dataset-initializer of the dataset-initializer job must mount volume "
            "'initializer'") in status["message"], status["message"]


def test_reserved_torch_environment_is_refused_for_torch_runtimes_only():
    env = [{"name": "PET_NNODES", "value": "3"}]
    override = {"targetJobs": [{"name": "node"}], "containers": [{"name": "node", "env": env}]}
    status = refused(trainjob(trainer={"env": env}, podSpecOverrides=[override]))
    # Upstream refuses spec.trainer.env as a whole, naming the variables.
    assert fields(status) == ["spec.trainer.env",
                              "spec.podSpecOverrides[0].containers[0].env[0].name"]
    assert "PET_NNODES: reserved" in status["message"]

    allowed(trainjob(runtimeRef={"name": "plain"}, trainer={"env": env},
                     podSpecOverrides=[override]))


def test_every_problem_is_reported_in_one_message():
    status = refused(trainjob(
        "Bad.Name", trainer={"numNodes": 0, "numProcPerNode": "tpu"},
        initializer={"dataset": {}}, runtimeRef={"name": "plain"},
        podSpecOverrides=[{"targetJobs": [{"name": "ghost"}]}],
    ))
    assert fields(status) == ["metadata.name", "spec.trainer.numNodes",
                              "spec.trainer.numProcPerNode",
                              "spec.podSpecOverrides[0].targetJobs[0].name",
                              "spec.runtimeRef"]
    assert status["message"].count("; ") == 4


# --- update --------------------------------------------------------------------------------


def updated(old: dict, **spec) -> dict:
    new = copy.deepcopy(old)
    for key, value in spec.items():
        if value is None:
            new["spec"].pop(key, None)
        else:
            new["spec"][key] = value
    new["metadata"]["generation"] = 2
    return new


@pytest.mark.parametrize("before, after", [
    (OPERATOR, MULTIKUEUE), (MULTIKUEUE, OPERATOR), (None, MULTIKUEUE), ("", OPERATOR),
    (MULTIKUEUE, None), (OPERATOR, ""),
])
def test_managed_by_is_immutable(before, after):
    old = trainjob() if before is None else trainjob(managedBy=before)
    status = refused(updated(old, managedBy=after), old)
    assert fields(status) == ["spec.managedBy"]
    assert "field is immutable (was " in status["message"]


@pytest.mark.parametrize("before, after", [(None, ""), ("", None), (MULTIKUEUE, MULTIKUEUE)])
def test_managed_by_unset_and_empty_are_the_same(before, after):
    old = trainjob() if before is None else trainjob(managedBy=before)
    allowed(updated(old, managedBy=after, trainer={"image": "v2"}), old)


def test_an_update_that_leaves_the_spec_alone_is_not_judged_again():
    lookups = TableLookups()
    old = trainjob(runtimeRef={"name": "deleted-since"})
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    allowed(new, old, lookups)
    assert lookups.calls == []


def test_a_changed_spec_is_checked_against_the_runtime_as_a_new_job_is():
    old = trainjob(suspend=True)
    status = refused(updated(old, podSpecOverrides=[{"targetJobs": [{"name": "nowhere"}]}]),
                     old)
    assert fields(status) == ["spec.podSpecOverrides[0].targetJobs[0].name"], status
    status = refused(updated(old, trainer={"numNodes": 0}), old)
    assert fields(status) == ["spec.trainer.numNodes"], status


def test_a_runtime_deleted_since_does_not_refuse_a_changed_spec():
    lookups = TableLookups()
    old = trainjob(runtimeRef={"name": "deleted-since"})
    allowed(updated(old, trainer={"image": "v2"}), old, lookups)
    assert lookups.calls, "the runtime was looked up"


OVERRIDE = {"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": "a"}}
INJECTED = {"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": "b"},
            "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}


def jobset_with(active: dict[str, int]) -> dict:
    return {"metadata": {"name": "job", "namespace": NS},
            "status": {"replicatedJobsStatus": [
                {"name": n, "active": a, "ready": 0, "succeeded": 0, "failed": 0,
                 "suspended": 0 if a else 1} for n, a in active.items()]}}


def test_unchanged_overrides_are_allowed_even_while_running():
    old = trainjob(podSpecOverrides=[OVERRIDE])
    lookups = TableLookups({(NS, "job"): jobset_with({"node": 3})})
    allowed(updated(old, trainer={"image": "v2"}), old, lookups)
    # Absent and empty are the same list.
    bare = trainjob()
    allowed(updated(bare, podSpecOverrides=[]), bare, lookups)


def test_changed_overrides_are_forbidden_while_not_suspended():
    old = trainjob(podSpecOverrides=[OVERRIDE])
    status = refused(updated(old, podSpecOverrides=[INJECTED]), old, code=403)
    assert fields(status) == ["spec.podSpecOverrides"]
    assert "only while the TrainJob is suspended" in status["message"]


def test_changed_overrides_are_allowed_while_suspended_without_a_jobset():
    old = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    lookups = TableLookups()
    allowed(updated(old, podSpecOverrides=[INJECTED]), old, lookups)
    assert ("jobset", NS, "job") in lookups.calls
    allowed(updated(old, podSpecOverrides=None), old, lookups)


def test_changed_overrides_are_allowed_while_suspended_with_an_inactive_jobset():
    old = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    lookups = TableLookups({(NS, "job"): jobset_with({"node": 0, "dataset-initializer": 0})})
    allowed(updated(old, podSpecOverrides=[INJECTED]), old, lookups)


def test_suspending_and_changing_overrides_in_one_update_is_allowed():
    old = trainjob(podSpecOverrides=[OVERRIDE])
    allowed(updated(old, suspend=True, podSpecOverrides=[INJECTED]), old)


def test_unsuspending_and_changing_overrides_in_one_update_is_forbidden():
    old = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    refused(updated(old, suspend=False, podSpecOverrides=[INJECTED]), old, code=403)


def test_changed_overrides_are_forbidden_while_one_replicated_job_is_active():
    old = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    lookups = TableLookups({(NS, "job"): jobset_with({"dataset-initializer": 0, "node": 2})})
    status = refused(updated(old, podSpecOverrides=[INJECTED]), old, lookups, code=403)
    assert "replicated job node still has active pods" in status["message"]
    assert f"JobSet {NS}/job" in status["message"]


def test_changed_overrides_are_forbidden_naming_every_active_replicated_job():
    old = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    lookups = TableLookups({(NS, "job"): jobset_with(
        {"node": 4, "launcher": 1, "dataset-initializer": 0})})
    status = refused(updated(old, podSpecOverrides=[INJECTED]), old, lookups, code=403)
    assert "replicated jobs node, launcher still have active pods" in status["message"]
    assert "dataset-initializer" not in status["message"]


def test_field_problems_and_forbidden_changes_together_are_invalid():
    old = trainjob(managedBy=OPERATOR, podSpecOverrides=[OVERRIDE])
    status = refused(updated(old, managedBy=MULTIKUEUE, podSpecOverrides=[INJECTED]), old)
    assert fields(status) == ["spec.managedBy", "spec.podSpecOverrides"]
    reasons = [c["reason"] for c in status["details"]["causes"]]
    assert reasons == ["FieldValueInvalid", "FieldValueForbidden"]


# --- other operations, malformed input, failing lookups -------------------------------------


def test_delete_is_allowed_without_looking_at_anything():
    review_ = {"request": {"uid": "u", "operation": "DELETE", "oldObject": trainjob()}}
    lookups = TableLookups()
    assert review(review_, lookups)["response"] == {"uid": "u", "allowed": True}
    assert lookups.calls == []


@pytest.mark.parametrize("body", [
    None, [], "AdmissionReview", {}, {"request": []}, {"request": {"operation": "CREATE"}},
    {"request": {"uid": "u", "operation": "PATCH", "object": trainjob()}},
    {"request": {"uid": "u", "operation": "CREATE", "object": "x"}},
    {"request": {"uid": "u", "operation": "CREATE", "object": {"metadata": {}}}},
    {"request": {"uid": "u", "operation": "CREATE", "object": {"spec": {}}}},
    {"request": {"uid": "u", "operation": "UPDATE", "object": trainjob()}},
])
def test_malformed_reviews_are_refused_with_400(body):
    result = review(body, TableLookups())
    uid = body["request"].get("uid", "") if isinstance(body, dict) and \
        isinstance(body.get("request"), dict) else ""
    assert_well_formed(result, uid)
    assert result["response"]["status"]["code"] == 400
    assert result["response"]["status"]["message"].startswith("malformed AdmissionReview")


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[" * 100_000, b"nan"])
def test_bodies_that_are_not_json_are_refused_with_400(body):
    result = review_json(body, TableLookups())
    assert_well_formed(result)
    assert result["response"]["status"]["code"] == 400


def test_a_failing_lookup_refuses_with_500_and_says_what_it_could_not_read():
    class Down(TableLookups):
        def runtime(self, namespace, kind, name):
            raise ConnectionError("apiserver unreachable")

    result = review(admission(trainjob()), Down())
    assert_well_formed(result, "7d2c-uid")
    status = result["response"]["status"]
    assert status["code"] == 500
    assert "cannot read ClusterTrainingRuntime torch" in status["message"]
    assert "apiserver unreachable" in status["message"]


# --- fuzz ----------------------------------------------------------------------------------

VOCABULARY = [
    "request", "uid", "operation", "object", "oldObject", "metadata", "name", "namespace",
    "generateName", "spec", "managedBy", "runtimeRef", "kind", "apiGroup", "trainer",
    "numNodes", "numProcPerNode", "env", "initializer", "dataset", "model",
    "podSpecOverrides", "targetJobs", "containers", "initContainers", "suspend", "status",
    "replicatedJobsStatus", "active", "template", "replicatedJobs", "mlPolicy", "torch", "mpi",
]
STRINGS = [
    "", "CREATE", "UPDATE", "DELETE", "node", "launcher", "torch", "plain", "local",
    "dataset-initializer", OPERATOR, MULTIKUEUE, "TrainingRuntime", "ClusterTrainingRuntime",
    "trainer.kubeflow.org", "auto", "gpu", "PET_NNODES", "²", "0", "12", "\x00", "ü" * 3,
    "a" * 300,
]


def random_value(rng: random.Random, depth: int = 0) -> object:
    choice = rng.random()
    if depth > 5 or choice < 0.45:
        return rng.choice([
            None, True, False, 0, 1, -1, 2**63, 3.5, -0.0, float("inf"),
            rng.choice(STRINGS), rng.randint(-5, 5), "".join(
                chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 8))),
        ])
    if choice < 0.7:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(VOCABULARY) if rng.random() < 0.8 else rng.choice(STRINGS):
            random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def mutate(rng: random.Random, value: object) -> object:
    """``value`` with one random subtree replaced, removed or grown."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        roll = rng.random()
        if roll < 0.2:
            del value[key]
        elif roll < 0.5:
            value[key] = random_value(rng)
        elif roll < 0.6:
            value[rng.choice(VOCABULARY)] = random_value(rng)
        else:
            value[key] = mutate(rng, value[key])
        return value
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        if rng.random() < 0.3:
            value.pop(i)
        else:
            value[i] = mutate(rng, value[i])
        return value
    return random_value(rng)


class GarbageLookups:
    """Returns random JSON as the runtime or JobSet: a schemaless template can hold anything."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def runtime(self, namespace, kind, name):
        if self.rng.random() < 0.2:
            return random_value(self.rng)
        found = copy.deepcopy(TORCH)
        jobs = found["spec"]["template"]["spec"]["replicatedJobs"]
        for _ in range(self.rng.randint(1, 4)):
            if self.rng.random() < 0.7:  # mostly inside a replicated job, where lookups dig
                i = self.rng.randrange(len(jobs))
                jobs[i] = mutate(self.rng, jobs[i])
            else:
                found = mutate(self.rng, found)
        return found

    def jobset(self, namespace, name):
        return mutate(self.rng, jobset_with({"node": 1})) if self.rng.random() < 0.7 \
            else random_value(self.rng)

    def priority_class(self, name):
        return random_value(self.rng) if self.rng.random() < 0.5 else None


def valid_reviews() -> list[dict]:
    full = trainjob(trainer={"numNodes": 2, "numProcPerNode": "auto",
                             "env": [{"name": "X", "value": "1"}]},
                    initializer={"dataset": {"storageUri": "s3://d"}, "model": {}},
                    podSpecOverrides=[{"targetJobs": [{"name": "node"}],
                                       "containers": [{"name": "node", "env": []}],
                                       "initContainers": [{"name": "prepare"}]}])
    suspended = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    return [admission(full), admission(trainjob(managedBy=MULTIKUEUE)),
            admission(updated(suspended, podSpecOverrides=[INJECTED]), suspended),
            admission(updated(full, managedBy=MULTIKUEUE), full)]


def test_fuzz_review_never_raises_and_always_answers_well_formed():
    rng = random.Random(20250603)
    templates = valid_reviews()
    outcomes = {"allowed": 0, 400: 0, 403: 0, 422: 0}
    for i in range(2000):
        if i % 2:
            body = random_value(rng)
            if rng.random() < 0.5:  # often shaped like a review, to get past the envelope
                body = {"request": {"uid": "fuzz", "operation": rng.choice(["CREATE", "UPDATE"]),
                                    "object": body, "oldObject": random_value(rng)}}
        else:
            body = copy.deepcopy(rng.choice(templates))
            for _ in range(rng.randint(1, 4)):
                # Mostly deep inside the TrainJob, where the rules are, sometimes anywhere.
                obj = body.get("request", {}).get("object") if isinstance(body, dict) and \
                    isinstance(body.get("request"), dict) else None
                if isinstance(obj, dict) and isinstance(obj.get("spec"), dict) \
                        and rng.random() < 0.7:
                    mutate(rng, obj["spec"])
                else:
                    body = mutate(rng, body)
        lookups = GarbageLookups(rng) if rng.random() < 0.3 else TableLookups(
            {(NS, "job"): jobset_with({"node": 1})})
        if rng.random() < 0.2:
            result = review_json(json.dumps(body), lookups)
        else:
            result = review(body, lookups)
        request = body.get("request") if isinstance(body, dict) else None
        uid = request["uid"] if isinstance(request, dict) and isinstance(request.get("uid"), str) \
            else ""
        assert_well_formed(result, uid)
        response = result["response"]
        # 500 means an exception escaped a rule: a bug, never an answer to bad input.
        assert response["allowed"] or response["status"]["code"] != 500, (body, response)
        outcomes["allowed" if response["allowed"] else response["status"]["code"]] += 1
    # The fuzz reached every kind of answer, not just the envelope check.
    print("fuzz outcomes:", outcomes)
    assert all(outcomes.values()), outcomes


# --- speed ---------------------------------------------------------------------------------


def latencies(body: dict, lookups: TableLookups, rounds: int = 400) -> tuple[float, float]:
    """The review's own CPU time (this thread's), p50 and p99 in ms: what a review costs,
    whatever else the machine runs (wall time on a busy machine is mostly waiting for a
    core)."""
    samples = []
    for _ in range(rounds):
        started = time.thread_time()
        review(body, lookups)
        samples.append(time.thread_time() - started)
    quantiles = statistics.quantiles(samples, n=100)
    return quantiles[49] * 1000, quantiles[98] * 1000


def test_a_review_takes_a_few_milliseconds_at_most():
    lookups = TableLookups({(NS, "job"): jobset_with({"node": 1})})
    create = valid_reviews()[0]
    suspended = trainjob(suspend=True, podSpecOverrides=[OVERRIDE])
    update = admission(updated(suspended, podSpecOverrides=[INJECTED]), suspended)
    review(create, lookups)  # imports the runtime framework once
    for label, body in (("create", create), ("update", update)):
        p50, p99 = latencies(body, lookups)
        print(f"review() {label}: p50 {p50:.3f} ms, p99 {p99:.3f} ms")
        assert p50 < 5, f"{label}: p50 {p50:.3f} ms"


# --- runtimes ------------------------------------------------------------------------------


def _runtime_review(runtime_obj: dict, operation: str = "CREATE") -> dict:
    review_request = admission(runtime_obj, runtime_obj if operation == "UPDATE" else None)
    review_request["request"]["kind"] = {"group": "trainer.kubeflow.org", "version": "v1alpha1",
                                         "kind": runtime_obj["kind"]}
    result = review(review_request, TableLookups())
    assert_well_formed(result, "7d2c-uid")
    return result["response"]


def _labelled(name: str, step: str, container: str, replicas: int | None = None) -> dict:
    job = replicated_job(container)
    job["name"] = name
    job["template"]["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}}
    if replicas is not None:
        job["replicas"] = replicas
    return job


def test_a_runtime_step_without_its_container_or_with_replicas_is_refused():
    bad = runtime("bad", [_labelled("node", "trainer", "main", replicas=2),
                          _labelled("fetch", "dataset-initializer", "dataset-initializer")])
    answer = _runtime_review(bad)
    assert not answer["allowed"]
    status = answer["status"]
    assert status["code"] == 422 and status["message"].startswith("ClusterTrainingRuntime bad: ")
    assert fields(status) == ["spec.template.spec.replicatedJobs[0].replicas",
                              "spec.template.spec.replicatedJobs[0].template.spec.template.spec."
                              "containers"]
    assert "a trainer step needs a container named node" in status["message"]
    assert status["details"]["kind"] == "ClusterTrainingRuntime"


def test_runtime_rules_apply_as_upstream_applies_them():
    # Unlabelled jobs are not steps; a good runtime passes; a TrainingRuntime is checked
    # on create only, a ClusterTrainingRuntime on update too.
    good = runtime("good", [_labelled("node", "trainer", "node"), replicated_job("helper")])
    assert _runtime_review(good)["allowed"]
    bad_ns = runtime("bad", [_labelled("node", "trainer", "main")], kind="TrainingRuntime")
    assert not _runtime_review(bad_ns)["allowed"]
    assert _runtime_review(bad_ns, "UPDATE")["allowed"]
    bad_cluster = runtime("bad", [_labelled("node", "trainer", "main")])
    assert not _runtime_review(bad_cluster, "UPDATE")["allowed"]


@pytest.mark.parametrize("manager", ["no-domain", "Example.com/x", "example.com/", 7])
def test_a_runtime_patch_manager_must_be_a_domain_prefixed_path(manager):
    status = refused(trainjob(runtimePatches=[{"manager": manager}]))
    # Upstream's field names no entry; the reason does.
    assert causes_of(status) == [("spec.runtimePatches.manager", "FieldValueInvalid")]
    assert "runtimePatches[0]: " in status["message"]
    assert "must be a domain-prefixed path such as example.com/queue" in status["message"]


# --- resources a pod cannot share -----------------------------------------------------------

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize("resources, words", [
    ({"requests": {GPU: "2"}}, f"limits[{GPU}]: required, equal to the request (2)"),
    ({"requests": {GPU: "2"}, "limits": {GPU: "1"}},
     f"limits[{GPU}]: 1 must equal the request (2)"),
    ({"requests": {"hugepages-2Mi": "1Gi"}}, "limits[hugepages-2Mi]: required"),
])
def test_a_resource_that_cannot_be_overcommitted_needs_its_limit(resources, words):
    status = refused(trainjob(trainer={"resourcesPerNode": resources}))
    assert f"spec.trainer.resourcesPerNode.{words}" in status["message"], status
    assert "cannot be overcommitted" in status["message"], status


@pytest.mark.parametrize("resources", [
    {"requests": {"cpu": "2", "memory": "1Gi"}},
    {"requests": {GPU: "2"}, "limits": {GPU: "2"}},
    {"limits": {GPU: "1"}},
])
def test_shareable_or_limited_resources_pass(resources):
    allowed(trainjob(trainer={"resourcesPerNode": resources}))
