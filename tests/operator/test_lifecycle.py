"""The training operator's lifecycle on a real worker cluster (worker-2): a runtime that
appears late, garbage collection of the JobSet, restarts and crashes, the API write cost of
one TrainJob, ``--namespace`` and ``--help``.

The operator runs as a separate process (``run_operator``), beside the worker's real JobSet
controller. Worker-2 has no Nodes here, so pods wait and JobSets stay active; where a JobSet
has to reach one particular end the test writes that condition, as upstream Kubeflow's tests
do, and the JobSet controller then leaves the finished JobSet alone.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, worker_stack
from clusters.testing import apiserver_writes, eventually, holds_for
from trainjob import constants as c

T = TypeVar("T")

WORKER = "worker-2"  # tests/operator's other file runs its operator on worker-1
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
CREATED = "Created"  # training_operator.status.CONDITION_CREATED, spelled as users see it


# ---------------------------------------------------------------- objects


def _replicated_job(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {c.ANCESTOR_LABEL: "trainer" if name == c.NODE else name}},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": name, "image": f"example.com/{name}:v1",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
            }}},
        },
    }




def runtime_body(kind: str, name: str, namespace: str | None = None,
                 jobset_manager: str | None = None) -> dict[str, Any]:
    """A torch runtime with a dataset initializer, a model initializer and the trainer."""
    template_spec: dict[str, Any] = {"replicatedJobs": [
        _replicated_job(c.DATASET_INITIALIZER),
        _replicated_job(c.MODEL_INITIALIZER),
        _replicated_job(c.NODE),
    ]}
    if jobset_manager:
        template_spec["managedBy"] = jobset_manager
    metadata: dict[str, Any] = {"name": name}
    if kind == c.TRAININGRUNTIME_KIND:
        metadata["namespace"] = namespace
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 2, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": template_spec},
        },
    }


def trainjob_body(name: str, runtime: str,
                  kind: str = c.CLUSTERTRAININGRUNTIME_KIND) -> dict[str, Any]:
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime, "apiGroup": c.TRAINER_GROUP, "kind": kind}},
    }


def create_trainjob(cluster, namespace: str, name: str, runtime: str,
                    kind: str = c.CLUSTERTRAININGRUNTIME_KIND) -> dict[str, Any]:
    return cluster.custom.create_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, trainjob_body(name, runtime, kind))


def get_trainjob(cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.custom.get_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, name)


def get_jobset(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return cluster.custom.get_namespaced_custom_object(*JOBSET, namespace, c.JOBSETS, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return item
    return None


def condition_is(obj: dict[str, Any], type_: str, status: str, reason: str | None = None) -> bool:
    found = condition(obj, type_)
    return (found is not None and found.get("status") == status
            and (reason is None or found.get("reason") == reason))


def brief(obj: dict[str, Any] | None) -> Any:
    """What a failure message should show of a TrainJob or JobSet: rv and status."""
    if obj is None:
        return None
    return {"resourceVersion": obj["metadata"].get("resourceVersion"),
            "status": obj.get("status")}


def events_about(cluster, namespace: str, trainjob: dict[str, Any]) -> list[dict[str, str]]:
    """The Events whose involvedObject is this TrainJob (by uid), oldest first."""
    events = cluster.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={trainjob['metadata']['name']},"
                                  f"involvedObject.kind={c.TRAINJOB_KIND}").items
    mine = [e for e in events if e.involved_object.uid == trainjob["metadata"]["uid"]]
    mine.sort(key=lambda e: int(e.metadata.resource_version))
    return [{"type": e.type, "reason": e.reason, "message": e.message} for e in mine]


def wait_created(cluster, namespace: str, name: str, timeout: float = 30) -> dict[str, Any]:
    """Wait for the TrainJob's JobSet and its Created=True condition; return the JobSet."""
    eventually(lambda: brief(get_trainjob(cluster, namespace, name)),
               lambda job: condition_is(job, CREATED, "True", "JobSetCreated"),
               expected=f"TrainJob {namespace}/{name} to get condition Created=True "
                        f"reason JobSetCreated", timeout=timeout)
    return eventually(lambda: get_jobset(cluster, namespace, name),
                      lambda jobset: jobset is not None,
                      expected=f"JobSet {namespace}/{name} to exist", timeout=timeout)


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def worker(multicluster):
    return multicluster[WORKER]


@pytest.fixture
def make_runtime(worker, namespace):
    """``make_runtime(kind=..., name=...)`` creates a torch runtime on worker-2 (name
    unique to the test: it includes the namespace); ClusterTrainingRuntimes are deleted
    at teardown, TrainingRuntimes go with the namespace."""
    made: list[str] = []

    def create(kind: str = c.CLUSTERTRAININGRUNTIME_KIND, name: str | None = None,
               jobset_manager: str | None = None) -> str:
        name = name or f"{namespace}-torch"
        body = runtime_body(kind, name, namespace, jobset_manager)
        if kind == c.CLUSTERTRAININGRUNTIME_KIND:
            made.append(name)
            worker.custom.create_cluster_custom_object(*TRAINER, c.CLUSTERTRAININGRUNTIMES, body)
        else:
            worker.custom.create_namespaced_custom_object(
                *TRAINER, namespace, c.TRAININGRUNTIMES, body)
        return name

    yield create
    for name in made:
        try:
            worker.custom.delete_cluster_custom_object(*TRAINER, c.CLUSTERTRAININGRUNTIMES, name)
        except ApiException as err:
            if err.status != 404:
                raise


@pytest.fixture
def other_namespace(worker, namespace):
    """A second namespace on worker-2 only, deleted afterwards."""
    name = f"{namespace}-b"
    worker.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        worker.core.delete_namespace(name)
    except ApiException as err:
        if err.status != 404:
            raise


# ---------------------------------------------------------------- 1. missing runtime


@pytest.mark.parametrize("kind", [c.CLUSTERTRAININGRUNTIME_KIND, c.TRAININGRUNTIME_KIND])
def test_missing_runtime_waits_and_starts_when_the_runtime_appears(
        worker, namespace, make_runtime, run_operator, kind):
    operator = run_operator(worker)
    runtime = f"{namespace}-late"
    created = create_trainjob(worker, namespace, "waits", runtime, kind)

    waiting = eventually(
        lambda: brief(get_trainjob(worker, namespace, "waits")),
        lambda job: condition_is(job, CREATED, "False", "RuntimeNotFound"),
        expected=f"TrainJob waits to get Created=False reason RuntimeNotFound ({kind} "
                 f"{runtime} does not exist)")
    message = condition(waiting, CREATED)["message"]
    assert runtime in message and kind in message, (
        f"expected the RuntimeNotFound message to name {kind} {runtime}; saw {message!r}")
    if kind == c.TRAININGRUNTIME_KIND:
        assert namespace in message, (
            f"expected the message to name the namespace {namespace} searched; saw {message!r}")

    eventually(
        lambda: events_about(worker, namespace, created),
        lambda events: any(e["type"] == "Warning" and e["reason"] == "RuntimeNotFound"
                           and runtime in e["message"] for e in events),
        expected=f"a Warning Event RuntimeNotFound naming {runtime} about TrainJob waits")
    holds_for(lambda: get_jobset(worker, namespace, "waits"), lambda jobset: jobset is None,
              seconds=2, expected=f"no JobSet {namespace}/waits while {kind} {runtime} is missing")
    assert operator.metric("training_operator_jobsets_created_total") == 0

    # The TrainJob is not touched again: only the runtime's appearance (watch) moves it on.
    make_runtime(kind=kind, name=runtime)
    jobset = wait_created(worker, namespace, "waits")
    after = get_trainjob(worker, namespace, "waits")
    assert after["metadata"]["generation"] == created["metadata"]["generation"], (
        f"expected the TrainJob's spec untouched (generation {created['metadata']['generation']}); "
        f"saw generation {after['metadata']['generation']}")
    owners = jobset["metadata"].get("ownerReferences") or []
    assert [o["uid"] for o in owners if o.get("controller")] == [created["metadata"]["uid"]], (
        f"expected the JobSet controlled by TrainJob uid {created['metadata']['uid']}; "
        f"saw ownerReferences {owners}")


# ---------------------------------------------------------------- 2. garbage collection


def test_deleting_a_trainjob_removes_its_jobset_through_the_garbage_collector(
        worker, namespace, make_runtime, run_operator):
    runtime = make_runtime()
    operator = run_operator(worker)
    trainjob = create_trainjob(worker, namespace, "doomed", runtime)
    jobset = wait_created(worker, namespace, "doomed")
    owners = jobset["metadata"].get("ownerReferences") or []
    expected_owner = {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
                      "name": "doomed", "uid": trainjob["metadata"]["uid"],
                      "controller": True, "blockOwnerDeletion": True}
    assert owners == [expected_owner], (
        f"expected exactly one ownerReference {expected_owner}; saw {owners}")

    # With the operator gone, only kube-controller-manager's garbage collector can remove it.
    operator.stop()
    worker.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "doomed")
    eventually(lambda: get_jobset(worker, namespace, "doomed"), lambda found: found is None,
               expected="JobSet doomed removed by the garbage collector after its TrainJob "
                        "was deleted", timeout=60)


def test_orphaning_delete_keeps_the_jobset_the_operator_never_deletes_it(
        worker, namespace, make_runtime, run_operator):
    runtime = make_runtime()
    operator = run_operator(worker, "--namespace", namespace)  # leftovers elsewhere may err
    create_trainjob(worker, namespace, "orphaner", runtime)
    jobset = wait_created(worker, namespace, "orphaner")

    worker.custom.delete_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "orphaner", propagation_policy="Orphan")
    eventually(lambda: get_jobset(worker, namespace, "orphaner"),
               lambda found: found is not None and not found["metadata"].get("ownerReferences"),
               expected="the garbage collector to orphan JobSet orphaner (ownerReferences "
                        "removed)", timeout=60)
    holds_for(lambda: get_jobset(worker, namespace, "orphaner"),
              lambda found: (found is not None
                             and found["metadata"]["uid"] == jobset["metadata"]["uid"]),
              seconds=3, expected="orphaned JobSet orphaner still there, same uid, with the "
                                  "operator running (it never deletes JobSets itself)")
    assert operator.metric("training_operator_reconcile_errors_total") == 0, operator.log_tail()


# ---------------------------------------------------------------- 3. restarts


def _snapshot(worker, namespace: str, names: list[str]) -> dict[str, Any]:
    state = {}
    for name in names:
        jobset = get_jobset(worker, namespace, name)
        meta = (jobset or {}).get("metadata") or {}
        state[name] = {
            "jobset": (meta.get("uid"), meta.get("resourceVersion"), meta.get("generation")),
            "trainjob": get_trainjob(worker, namespace, name)["metadata"]["resourceVersion"],
        }
    return state


def test_restart_after_sigkill_creates_nothing_twice_and_rewrites_no_status(
        worker, namespace, make_runtime, run_operator):
    # Only the operator acts on these JobSets: nothing else may change them during the test.
    runtime = make_runtime(jobset_manager=worker_stack.JOBSET_MANAGED_BY_TEST)
    first = run_operator(worker, "--namespace", namespace)
    names = [f"restart-{i}" for i in range(5)]
    created = {name: create_trainjob(worker, namespace, name, runtime) for name in names}
    for name in names:
        wait_created(worker, namespace, name)
    # Let the first operator finish its work (one Created Event each) so that nothing it
    # still had in flight is blamed on the second.
    for name in names:
        eventually(lambda job=created[name]: events_about(worker, namespace, job),
                   lambda events: [e["reason"] for e in events] == ["JobSetCreated"],
                   expected=f"exactly one Event JobSetCreated about TrainJob {name}")
    assert (first.metric("training_operator_jobsets_created_total"),
            first.metric("training_operator_status_writes_total")) == (5, 5), (
        "expected the first operator to create 5 JobSets with 5 status writes; saw "
        f"{first.metric('training_operator_jobsets_created_total')} JobSets, "
        f"{first.metric('training_operator_status_writes_total')} status writes")
    before = _snapshot(worker, namespace, names)

    first.stop(kill=True)
    second = run_operator(worker, "--namespace", namespace)
    eventually(lambda: second.metric("training_operator_reconcile_duration_seconds_count"),
               lambda count: count >= 5,
               expected="the restarted operator to reconcile all 5 TrainJobs "
                        "(training_operator_reconcile_duration_seconds_count >= 5)")
    holds_for(lambda: _snapshot(worker, namespace, names), lambda now: now == before,
              seconds=3, expected=f"every JobSet (uid, resourceVersion, generation) and "
                                  f"TrainJob resourceVersion unchanged from {before}")
    written = {metric: second.metric(metric) for metric in (
        "training_operator_jobsets_created_total", "training_operator_status_writes_total",
        "training_operator_reconcile_errors_total")}
    assert all(value == 0 for value in written.values()), (
        f"expected the restarted operator to write nothing; saw {written}\n{second.log_tail()}")
    for name in names:
        reasons = [e["reason"] for e in events_about(worker, namespace, created[name])]
        assert reasons == ["JobSetCreated"], (
            f"expected no new Event about {name} after the restart; saw {reasons}")


def test_crash_between_steps_is_resumed_after_restart(
        worker, namespace, make_runtime, run_operator):
    runtime = make_runtime()
    first = run_operator(worker, "--namespace", namespace)
    create_trainjob(worker, namespace, "half-done", runtime)
    wait_created(worker, namespace, "half-done")
    first.stop(kill=True)

    # A crash after the JobSet was applied but before the status was written: the JobSet
    # exists and the TrainJob shows nothing.
    worker.custom.patch_namespaced_custom_object_status(
        *TRAINER, namespace, c.TRAINJOBS, "half-done",
        {"status": {"conditions": [], "jobsStatus": []}},
        _content_type="application/merge-patch+json")
    half_done = get_jobset(worker, namespace, "half-done")
    # A TrainJob created while no operator runs.
    create_trainjob(worker, namespace, "while-down", runtime)
    assert get_jobset(worker, namespace, "while-down") is None

    second = run_operator(worker, "--namespace", namespace)
    wait_created(worker, namespace, "half-done")
    wait_created(worker, namespace, "while-down")
    now = get_jobset(worker, namespace, "half-done")
    # Same object, same spec (the JobSet controller may have updated its status meanwhile).

    def kept(js):
        return js["metadata"]["uid"], js["metadata"]["generation"]

    assert kept(now) == kept(half_done), (
        f"expected JobSet half-done kept as it was (uid, generation) {kept(half_done)}; "
        f"saw {kept(now)}")
    eventually(lambda: (second.metric("training_operator_jobsets_created_total"),
                        second.metric("training_operator_status_writes_total")),
               lambda seen: seen[0] == 1 and seen[1] >= 2,
               expected="the restarted operator to create 1 JobSet (while-down) and write "
                        "the statuses of half-done and while-down: (jobsets, status writes) "
                        "= (1, at least 2)")


# ---------------------------------------------------------------- 4. API write cost

# The objects a TrainJob's life writes. Core Events only: the operator's recorder writes v1
# Events, and controllers in kube-controller-manager use events.k8s.io.
COUNTED = {(c.TRAINER_GROUP, c.TRAINJOBS), (c.JOBSET_GROUP, c.JOBSETS), ("", "events"),
           ("", "secrets"), ("", "configmaps")}


def _terminating_namespaces(cluster, keep: set[str]) -> list[str]:
    return [ns.metadata.name for ns in cluster.core.list_namespace().items
            if ns.status.phase == "Terminating" and ns.metadata.name not in keep]


def _status_changes(worker, namespace: str, name: str, stop: threading.Event,
                    seen: list[dict]) -> None:
    """Every distinct status TrainJob ``name`` goes through, from a watch."""
    last = None
    while not stop.is_set():
        stream = watch.Watch().stream(
            worker.custom.list_namespaced_custom_object, *TRAINER, namespace, c.TRAINJOBS,
            field_selector=f"metadata.name={name}", timeout_seconds=1)
        for event in stream:
            status = event["object"].get("status")
            if status and status != last:
                seen.append(status)
                last = status


def test_api_write_cost_of_one_trainjob_from_creation_to_complete(
        worker, namespace, make_runtime, run_operator):
    """From creation to Complete through the real JobSet controller and kwok: the operator
    applies the JobSet once, writes the status only when it changes, and records one Event
    for each of its two transitions."""
    # Earlier tests' namespaces may still be emptied by the namespace controller and the
    # garbage collector; let them finish so their writes are not counted here.
    eventually(lambda: _terminating_namespaces(worker, {namespace}), lambda left: not left,
               expected="no other namespace on worker-2 still terminating", timeout=120)
    node = f"{namespace}-node"
    fixtures.add_node(worker.api, node, {"cpu": "8", "memory": "32Gi"})
    try:
        runtime = make_runtime()
        operator = run_operator(worker, "--namespace", namespace)
        before = apiserver_writes(worker, COUNTED)
        stop, statuses = threading.Event(), []
        watcher = threading.Thread(target=_status_changes,
                                   args=(worker, namespace, "costed", stop, statuses))
        watcher.start()
        try:
            trainjob = create_trainjob(worker, namespace, "costed", runtime)  # the test's write
            done = eventually(lambda: brief(get_trainjob(worker, namespace, "costed")),
                              lambda job: condition_is(job, c.CONDITION_COMPLETE, "True",
                                                       "AllJobsCompleted"),
                              expected="TrainJob costed Complete=True reason AllJobsCompleted "
                                       "once its pods succeeded on kwok", timeout=90)
            eventually(lambda: events_about(worker, namespace, trainjob),
                       lambda events: len(events) >= 2,
                       expected="the operator's two Events (JobSetCreated, Completed) about costed")
            # Nothing more arrives: no late status write, no extra Event.
            holds_for(lambda: (get_trainjob(worker, namespace, "costed")["metadata"]
                               ["resourceVersion"], len(events_about(worker, namespace, trainjob))),
                      lambda seen: seen == (done["resourceVersion"], 2),
                      seconds=2, expected="TrainJob costed and its 2 Events unchanged")
        finally:
            stop.set()
            watcher.join(10)
        after = apiserver_writes(worker, COUNTED)
    finally:
        fixtures.remove_node(worker.api, node)

    observed = Counter({key: after[key] - before[key] for key in after
                        if after[key] != before[key]})
    print(f"\nAPI writes while one TrainJob ran, creation to Complete (apiserver_request_total "
          f"on {WORKER}; the JobSet controller writes JobSet status and its own Events):")
    for (resource, subresource, verb), count in sorted(observed.items()):
        print(f"  {verb:6} {resource + (f'/{subresource}' if subresource else ''):18} {count}")
    print(f"  distinct TrainJob statuses seen by a watch: {len(statuses)}")
    # The TrainJob's writes are all the operator's but the test's create: one server-side
    # apply of the JobSet, and one status write per distinct status (none rewrites an equal
    # status), at least Created and then Complete.
    assert observed[("trainjobs", "", "POST")] == 1
    assert observed[("jobsets", "", "APPLY")] == 1, dict(observed)
    status_writes = observed[("trainjobs", "status", "PATCH")]
    assert 2 <= status_writes == len(statuses), (
        f"expected one status write per distinct status ({len(statuses)} seen); the apiserver "
        f"counted {status_writes}\n{operator.log_tail()}")
    assert [e["reason"] for e in events_about(worker, namespace, trainjob)] == [
        "JobSetCreated", "Completed"]
    assert (operator.metric("training_operator_jobsets_created_total"),
            operator.metric("training_operator_status_writes_total")) == (1, status_writes), (
        "expected the operator's own metrics to agree (1 JobSet, "
        f"{status_writes} status writes); saw "
        f"{operator.metric('training_operator_jobsets_created_total')}, "
        f"{operator.metric('training_operator_status_writes_total')}")


# ---------------------------------------------------------------- 5. --namespace


def test_namespace_flag_restricts_reconciling_to_that_namespace(
        worker, namespace, other_namespace, make_runtime, run_operator):
    runtime = make_runtime()
    operator = run_operator(worker, "--namespace", namespace)
    outside = create_trainjob(worker, other_namespace, "outside", runtime)
    create_trainjob(worker, namespace, "inside", runtime)
    wait_created(worker, namespace, "inside")

    holds_for(
        lambda: (get_jobset(worker, other_namespace, "outside"),
                 get_trainjob(worker, other_namespace, "outside").get("status"),
                 events_about(worker, other_namespace, outside)),
        lambda seen: seen == (None, None, []),
        seconds=3, expected=f"TrainJob {other_namespace}/outside (outside --namespace "
                            f"{namespace}) with no JobSet, no status and no Event")
    assert operator.metric("training_operator_jobsets_created_total") == 1


# ---------------------------------------------------------------- 6. --help


RUN_FLAGS = {
    # flag: words its explanation must contain
    "--kubeconfig": ("kubeconfig", "in-cluster"),
    "--namespace": ("namespace", "all namespaces"),
    "--webhook-port": ("port", "webhook"),
    "--webhook-cert-dir": ("tls.crt", "tls.key", "webhook"),
    "--metrics-port": ("port", "/metrics"),
}


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "training_operator", *args],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (
        f"expected `python -m training_operator {' '.join(args)}` to exit 0; "
        f"saw {done.returncode}: {done.stderr}")
    return done.stdout


def _option_blocks(help_text: str) -> dict[str, str]:
    """Each option's help entry (flag line and its wrapped explanation), by long flag."""
    blocks: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        stripped = line.strip()
        if line.startswith("  -") and not line.startswith("   "):
            current = stripped.split()[0].rstrip(",")
            flags = [w.rstrip(",") for w in stripped.split() if w.startswith("--")]
            current = flags[0] if flags else current
            blocks[current] = stripped
        elif current and line.startswith("    ") and stripped:
            blocks[current] += " " + stripped
        elif not stripped:
            current = None
    return blocks


def test_help_explains_the_run_command_and_every_flag():
    top = _help("--help")
    assert "run" in top and "JobSet" in top, (
        f"expected the top-level --help to describe the operator and its run command; saw:\n{top}")
    script = Path(sys.executable).parent / "training-operator"
    assert script.exists(), f"expected the console script {script} to be installed"

    text = _help("run", "--help")
    blocks = _option_blocks(text)
    for flag, words in RUN_FLAGS.items():
        entry = blocks.get(flag)
        assert entry is not None, f"expected `run --help` to list {flag}; saw:\n{text}"
        explanation = entry.split(None, 2)[2] if len(entry.split(None, 2)) > 2 else ""
        missing = [w for w in words if w.lower() not in explanation.lower()]
        assert len(explanation) >= 20 and not missing, (
            f"expected `run --help` to explain {flag} (mentioning {words}); saw {entry!r}")
