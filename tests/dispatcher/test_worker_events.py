"""The worker's reasons on the manager: Warning Events of a placed job's copy and of its
Pods on the worker, recorded on the manager's TrainJob by the dispatcher (on by default,
``--mirror-worker-events``), naming the worker and the object, one manager Event per
reason, object and message however often the worker says it again; and none about
objects that are not the dispatcher's copies' or not of the job placed there.

Everything here is real: the worker's scheduler cannot place a Pod that needs a
PersistentVolumeClaim nobody made (placement does not look at volumes) and says so in
FailedScheduling Events; the worker's operator refuses to build a copy whose JobSet name
is taken, with a Warning Event on the copy.
"""

from __future__ import annotations

import re

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, worker_stack
from clusters.testing import eventually, holds_for
from trainjob import constants as c

from dispatch_helpers import RUNTIME, TRAINER, create, get, placement, wait_placed

UNBOUND = "needs-a-missing-claim"  # its Pods need a PersistentVolumeClaim that is not there
MISSING_CLAIM = "no-such-claim"
PLAIN = "trainer-only"
WATCHES = 2
# A failed job's copy deleted as soon as the manager shows it Failed (the default keeps it
# 900 s): that why it failed is still told after is what a test here shows.
DISPATCHER_ARGS = ("--failed-retention", "0",
                   # Two watched namespaces a worker at most (the rest listed, every second
                   # here): the tests here run with namespaces over the limit too.
                   "--worker-event-watches", str(WATCHES), "--worker-event-list-interval", "1")


def _runtime(name: str, namespace: str, claim: str | None = None,
             outcome: str = worker_stack.OUTCOME_NEVER) -> dict:
    """A namespaced runtime with just the trainer job, one small pod per node that runs
    until deleted (``outcome``: or fails a moment after it starts); with ``claim``, each
    pod mounts that PersistentVolumeClaim."""
    pod_spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                      "containers": [{"name": c.NODE, "image": "pytorch/pytorch:2.5.0",
                                      "resources": {"requests": {"cpu": "100m",
                                                                 "memory": "128Mi"}}}]}
    if claim:
        pod_spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        pod_spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAININGRUNTIME_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mlPolicy": {"numNodes": 1},
                 "template": {"spec": {"replicatedJobs": [{
                     "name": c.NODE, "template": {
                         "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                         "spec": {"backoffLimit": 0, "template": {
                             "metadata": {"annotations": {
                                 worker_stack.OUTCOME_ANNOTATION: outcome,
                                 worker_stack.RUN_FOR_ANNOTATION: "1s"}},
                             "spec": pod_spec}}}}]}}},
    }


def _job(name: str, runtime: str, *, dispatched: bool = True,
         kind: str = c.TRAININGRUNTIME_KIND) -> dict:
    spec: dict = {"runtimeRef": {"name": runtime, "kind": kind},
                  "trainer": {"numNodes": 1,
                              "resourcesPerNode": {"requests": {"cpu": "100m"}}}}
    if dispatched:
        spec["managedBy"] = c.MANAGED_BY_MULTIKUEUE
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name}, "spec": spec}


def _manager_events(env, namespace: str, name: str) -> list[client.CoreV1Event]:
    """The Events on the manager's TrainJob ``namespace/name`` (this very object)."""
    job = get(env.manager, namespace, name)
    if job is None:
        return []
    return env.manager.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={job['metadata']['uid']}").items


def _shown(env, namespace: str, name: str, reason: str) -> list[tuple[str, int]]:
    """(message, count) of the manager job's Events of ``reason``, oldest first."""
    events = sorted((e for e in _manager_events(env, namespace, name) if e.reason == reason),
                    key=lambda e: e.metadata.creation_timestamp)
    return [(e.message, e.count or 1) for e in events]


def _pods(worker, namespace: str, job: str) -> list[str]:
    return sorted(p.metadata.name for p in worker.core.list_namespaced_pod(
        namespace, label_selector=f"{c.JOBSET_NAME_LABEL}={job}").items)


def _failures(worker, namespace: str, pod: str) -> dict[str, int]:
    """The worker's FailedScheduling messages about ``pod``, each with how often it was
    said (over every Event object that says it: a count, a series, or several)."""
    said: dict[str, int] = {}
    for event in worker.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod},reason=FailedScheduling").items:
        times = max((event.series.count if event.series else 0) or 0, event.count or 0, 1)
        said[event.message] = said.get(event.message, 0) + times
    return said


def namespace_on_every_cluster(dispatch_env, name: str):
    """Make namespace ``name`` on every cluster; yield it; delete it (a fixture's body)."""
    for cluster in dispatch_env.multicluster:
        cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    for cluster in dispatch_env.multicluster:
        try:
            cluster.core.delete_namespace(name)
        except ApiException:
            pass


@pytest.fixture
def other_namespace(dispatch_env, namespace):
    """A second namespace on every cluster, for objects the dispatcher did not make."""
    yield from namespace_on_every_cluster(dispatch_env, f"{namespace}-x"[:63])


def test_a_pod_the_workers_scheduler_cannot_place_is_told_once_on_the_manager_job(
        dispatch_env, namespace):
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    # The runtime only on worker-1: the job can go nowhere else.
    fixtures.install_runtime(worker.api, _runtime(UNBOUND, namespace, claim=MISSING_CLAIM))
    create(env.manager, namespace, _job("stuck", UNBOUND))
    placed, _ = wait_placed(env, namespace, "stuck")
    assert placed == "worker-1"
    [pod] = eventually(lambda: _pods(worker, namespace, "stuck"), lambda pods: len(pods) == 1,
                       expected="the copy's one Pod on worker-1", timeout=60)

    prefix = f"worker-1: Pod {pod}: "
    [(message, _)] = eventually(
        lambda: _shown(env, namespace, "stuck", "FailedScheduling"), bool, timeout=60,
        expected=f"a FailedScheduling Event on the manager's TrainJob naming worker-1 and "
                 f"Pod {pod}")
    assert message.startswith(prefix), message
    assert f'persistentvolumeclaim "{MISSING_CLAIM}" not found' in message, message
    [event] = [e for e in _manager_events(env, namespace, "stuck")
               if e.reason == "FailedScheduling"]
    assert event.type == "Warning" and event.source.component == "trainjob-dispatcher"
    assert event.involved_object.kind == c.TRAINJOB_KIND

    # The scheduler looks at an unschedulable Pod again when a Node comes; it says the same
    # again once the Node has gone and another comes. Until it has repeated itself:
    added = 0

    def repeated() -> dict[str, int]:
        nonlocal added
        said = _failures(worker, namespace, pod)
        if max(said.values()) >= 2 or added >= 6:
            return said
        node = f"{namespace}-retry-{added}"[:63]
        added += 1
        fixtures.add_node(worker.api, node, {"cpu": "1", "memory": "1Gi", "pods": "10"})
        try:
            eventually(lambda: sum(_failures(worker, namespace, pod).values()),
                       lambda total: total > sum(said.values()), timeout=60,
                       expected=f"worker-1's scheduler to try Pod {pod} again on Node {node}")
        finally:
            fixtures.remove_node(worker.api, node)
        return _failures(worker, namespace, pod)

    said = eventually(repeated, lambda said: max(said.values()) >= 2, timeout=300,
                      interval=0.5, expected=f"worker-1's scheduler to say the same about "
                                             f"{pod} more than once")

    def shown() -> dict[str, list[int]]:
        counts: dict[str, list[int]] = {}
        for text, count in _shown(env, namespace, "stuck", "FailedScheduling"):
            counts.setdefault(text.removeprefix(prefix), []).append(count)
        return counts

    # One manager Event per message, counting every time the worker said it.
    wanted = {text: [times] for text, times in said.items()}
    eventually(shown, lambda seen: seen == wanted, timeout=60,
               expected=f"one manager Event per FailedScheduling message, counted as the "
                        f"worker said each: {wanted}")
    holds_for(shown, lambda seen: seen == wanted, seconds=5,
              expected=f"no other manager Event of the same message: {wanted}")


def test_the_operators_warning_on_the_copy_is_told_on_the_manager_job(dispatch_env, namespace):
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    fixtures.install_runtime(worker.api, _runtime(PLAIN, namespace))
    # A JobSet of the job's name, made by someone else: the operator will not take it over.
    worker.custom.create_namespaced_custom_object(
        c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, {
            "apiVersion": f"{c.JOBSET_GROUP}/{c.JOBSET_VERSION}", "kind": "JobSet",
            "metadata": {"name": "clash"},
            "spec": {"suspend": True, "replicatedJobs": [{
                "name": "other", "replicas": 1, "template": {"spec": {"template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}]}}}}}]}})
    create(env.manager, namespace, _job("clash", PLAIN))
    placed, _ = wait_placed(env, namespace, "clash")
    assert placed == "worker-1"
    shown = eventually(
        lambda: _shown(env, namespace, "clash", "JobSetBuildFailed"), bool, timeout=60,
        expected="the operator's JobSetBuildFailed Warning on the copy, on the manager job")
    assert shown == [(f"worker-1: TrainJob clash: JobSet {namespace}/clash exists and is not "
                      "controlled by this TrainJob", 1)], shown


def test_why_a_job_failed_is_told_after_its_copy_is_gone(dispatch_env, namespace):
    """The Job controller's BackoffLimitExceeded and the operator's Failed come as the copy
    finishes; the copy is deleted as soon as its status reached the manager, and they are
    shown all the same."""
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    fixtures.install_runtime(worker.api, _runtime(PLAIN, namespace,
                                                  outcome=worker_stack.OUTCOME_FAIL))
    create(env.manager, namespace, _job("failing", PLAIN))
    assert wait_placed(env, namespace, "failing")[0] == "worker-1"
    eventually(lambda: get(worker, namespace, "failing"), lambda copy: copy is None,
               timeout=90, expected="the failed job's copy deleted from worker-1")
    shown = eventually(
        lambda: {e.reason: e.message for e in _manager_events(env, namespace, "failing")
                 if e.message.startswith("worker-1: ")},
        lambda seen: "BackoffLimitExceeded" in seen and "Failed" in seen, timeout=60,
        expected="the Job's BackoffLimitExceeded and the copy's Failed on the manager job")
    assert shown["BackoffLimitExceeded"].startswith(
        f"worker-1: Job failing-{c.NODE}-0: "), shown
    assert shown["Failed"].startswith("worker-1: TrainJob failing: "), shown


def test_events_of_objects_that_are_not_the_dispatchers_are_not_told(
        dispatch_env, namespace, other_namespace):
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    for ns in (namespace, other_namespace):
        fixtures.install_runtime(worker.api, _runtime(UNBOUND, ns, claim=MISSING_CLAIM))
    # A job of the dispatcher's on worker-1, whose Events are shown: the namespace's
    # Warning Events are watched.
    create(env.manager, namespace, _job("anchor", UNBOUND))
    assert wait_placed(env, namespace, "anchor")[0] == "worker-1"
    eventually(lambda: _shown(env, namespace, "anchor", "FailedScheduling"), bool, timeout=60,
               expected="anchor's FailedScheduling shown on the manager")
    [anchor_pod] = _pods(worker, namespace, "anchor")

    # Made on worker-1 by someone else (no managedBy: the worker's operator runs them):
    # a same-named job in another namespace, and one in this namespace whose name a
    # manager job has too (that one goes to worker-2: worker-1's is not its copy).
    worker_jobs = ((other_namespace, "anchor"), (namespace, "stranger"))
    for ns, name in worker_jobs:
        create(worker, ns, _job(name, UNBOUND, dispatched=False))
    create(env.manager, other_namespace, _job("anchor", UNBOUND, dispatched=False))
    create(env.manager, namespace, _job("stranger", RUNTIME,
                                        kind=c.CLUSTERTRAININGRUNTIME_KIND))
    # Placed on worker-1 first, maybe (best fit), until its create meets the name there.
    eventually(lambda: (placement(get(env.manager, namespace, "stranger")),
                        get(env.multicluster["worker-2"], namespace, "stranger")),
               lambda seen: seen[0] == "worker-2" and seen[1] is not None, timeout=60,
               expected="the manager's stranger placed on worker-2 and copied there")
    for ns, name in worker_jobs:
        eventually(lambda ns=ns, name=name: [
            p for p in _pods(worker, ns, name) if _failures(worker, ns, p)], bool, timeout=60,
            expected=f"FailedScheduling on worker-1 for the Pods of {ns}/{name}")

    def told() -> dict[str, list[str]]:
        return {
            "anchor": [e.message for e in _manager_events(env, namespace, "anchor")
                       if e.message.startswith("worker-1: ")],
            "other anchor": [e.message for e in _manager_events(env, other_namespace,
                                                                  "anchor")],
            "stranger": [e.message for e in _manager_events(env, namespace, "stranger")
                         if e.message.startswith("worker-1: ")]}

    def only_their_own(seen: dict[str, list[str]]) -> bool:
        return seen["other anchor"] == [] and seen["stranger"] == [] and seen["anchor"] and \
            all(re.match(rf"worker-1: Pod {anchor_pod}: ", text) for text in seen["anchor"])

    holds_for(told, only_their_own, seconds=5,
              expected="no worker-1 Event of objects the dispatcher did not make, nor of "
                       "another namespace, on any manager job")


@pytest.fixture
def third_namespace(dispatch_env, namespace):
    yield from namespace_on_every_cluster(dispatch_env, f"{namespace}-y"[:63])


def _event_reads(env) -> tuple[float, float, float]:
    """worker-1's namespaces whose Warning Events are watched, listed, and over the limit
    (with copies, but listed), as the dispatcher's /metrics says."""
    dispatcher = env.dispatcher
    return (dispatcher.metric("dispatcher_worker_event_namespaces", cluster="worker-1",
                              read="watch"),
            dispatcher.metric("dispatcher_worker_event_namespaces", cluster="worker-1",
                              read="list"),
            dispatcher.metric("dispatcher_worker_event_namespaces_over_limit",
                              cluster="worker-1"))


def test_namespaces_over_the_watch_limit_are_listed_and_their_events_told(
        dispatch_env, namespace, other_namespace, third_namespace):
    """Three namespaces of worker-1 hold copies, the dispatcher watches two at most: the
    third's Warning Events are listed instead, and told all the same. When a watched
    namespace has no copy left, its watch stops and the waiting one is watched."""
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    spaces = (namespace, other_namespace, third_namespace)
    for ns in spaces:  # the runtime only on worker-1: each job can go nowhere else
        fixtures.install_runtime(worker.api, _runtime(PLAIN, ns))
        create(env.manager, ns, _job("counted", PLAIN))
    copies = {}
    for ns in spaces:
        placed, copies[ns] = wait_placed(env, ns, "counted")
        assert placed == "worker-1", (ns, placed)
    # Earlier tests' namespaces may still hold copies a moment: until they are gone.
    seen = eventually(lambda: _event_reads(env), lambda reads: reads[0] == WATCHES
                      and reads[2] == len(spaces) - WATCHES, timeout=60,
                      expected=f"{WATCHES} namespaces of worker-1 watched and "
                               f"{len(spaces) - WATCHES} over the limit "
                               "(watch, list, over the limit)")
    assert seen[1] >= len(spaces) - WATCHES, seen
    # A Warning Event on each copy, as a controller of the worker would write it.
    for ns in spaces:
        meta = copies[ns]["metadata"]
        worker.core.create_namespaced_event(ns, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "counted.", "namespace": ns},
            "involvedObject": {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
                               "name": meta["name"], "namespace": ns, "uid": meta["uid"]},
            "type": "Warning", "reason": "QuotaWarning", "message": f"checked in {ns}",
            "source": {"component": "a-worker-controller"}, "count": 1})
    for ns in spaces:
        eventually(lambda ns=ns: _shown(env, ns, "counted", "QuotaWarning"),
                   lambda shown, ns=ns: shown == [
                       (f"worker-1: TrainJob counted: checked in {ns}", 1)], timeout=30,
                   expected=f"worker-1's QuotaWarning about {ns}/counted told once on the "
                            "manager job")

    # A namespace's last copy goes: nothing waits for a watch any more; the one left
    # without copies is only listed (for a while: a late Event of the job is still told).
    env.manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                       "counted")
    eventually(lambda: get(worker, namespace, "counted"), lambda copy: copy is None,
               timeout=30, expected=f"the copy {namespace}/counted deleted from worker-1")
    seen = eventually(lambda: _event_reads(env),
                      lambda reads: reads[0] == WATCHES and reads[2] == 0, timeout=30,
                      expected=f"the two namespaces with copies watched, none over the limit, "
                               f"once {namespace} has no copy (watch, list, over the limit)")
    assert seen[1] >= 1, f"{namespace} listed a while after its last copy went: {seen}"
