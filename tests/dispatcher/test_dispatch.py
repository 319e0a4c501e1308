"""The dispatcher against real apiservers, with the real operator on each worker."""

from __future__ import annotations

import base64
import contextlib
import re
import time
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from bench import dispatch_log
from clusters import fixtures
from clusters.testing import eventually, holds_for, machine_load, stretched
from trainjob import constants as c

from dispatch_helpers import (
    MK,
    PYTHON_GC_SWEEP_SECONDS,
    QUICK_RUNTIME,
    TRAINER,
    active,
    complete_jobset,
    condition,
    create,
    get,
    placement,
    remotes,
    trainjob,
    wait_no_namespace_terminating,
    wait_pending,
    wait_placed,
)


def test_full_path_from_manager_to_worker_and_back(dispatch_env, namespace):
    env = dispatch_env
    # Real pods on the worker's kwok Node, succeeding a second after they start.
    manager_job = create(env.manager, namespace, trainjob("full", num_nodes=2,
                                                          runtime=QUICK_RUNTIME))
    worker_name, remote = wait_placed(env, namespace, "full")

    # The copy: origin label, manager UID, manager spec without managedBy.
    assert remote["metadata"]["labels"][c.MULTIKUEUE_ORIGIN_LABEL] == c.DEFAULT_ORIGIN
    assert remote["metadata"]["annotations"][c.MANAGER_UID_ANNOTATION] == \
        manager_job["metadata"]["uid"]
    assert "managedBy" not in remote["spec"]
    assert remote["spec"]["trainer"] == manager_job["spec"]["trainer"]

    worker = env.multicluster[worker_name]
    eventually(lambda: get(worker, namespace, "full", c.JOBSETS,
                           (c.JOBSET_GROUP, c.JOBSET_VERSION)),
               lambda js: js is not None,
               expected=f"the operator on {worker_name} to create JobSet {namespace}/full")
    manager_obj = eventually(
        lambda: get(env.manager, namespace, "full"),
        lambda obj: (condition(obj, "Created") or {}).get("status") == "True",
        expected="the worker's Created condition mirrored onto the manager")
    assert c.DISPATCH_FINALIZER in manager_obj["metadata"]["finalizers"]

    manager_obj = eventually(
        lambda: get(env.manager, namespace, "full"),
        lambda obj: (condition(obj, "Complete") or {}).get("status") == "True",
        expected="manager TrainJob Complete after the worker's pods succeeded", timeout=90)
    complete = condition(manager_obj, "Complete")
    assert complete["reason"] == "AllJobsCompleted"
    assert complete["message"] == "jobset completed successfully"  # the JobSet controller's
    assert sorted(manager_obj["status"]["jobsStatus"], key=lambda j: j["name"]) == [
        {"name": name, "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
        for name in (c.DATASET_INITIALIZER, c.MODEL_INITIALIZER, c.NODE)]
    # Placed=True names the worker; the rest of the status is the worker's, whole.
    placed = condition(manager_obj, c.CONDITION_PLACED) or {}
    assert (placed.get("status"), placed.get("reason"), placed.get("message")) == (
        "True", c.REASON_PLACED, f"placed on worker cluster {worker_name}"), placed
    remote_status = get(worker, namespace, "full")
    if remote_status is not None:
        copied = [x for x in manager_obj["status"]["conditions"]
                  if x["type"] != c.CONDITION_PLACED]
        assert {**manager_obj["status"], "conditions": copied} == remote_status["status"]


def test_training_operator_jobs_on_the_manager_are_never_touched(dispatch_env, namespace):
    env = dispatch_env
    created = create(env.manager, namespace, trainjob("local", managed_by=None))
    # Wake the dispatcher with a job of its own and wait until it is done with it, so the
    # observation below happens after the dispatcher demonstrably processed this namespace.
    create(env.manager, namespace, trainjob("mine"))
    wait_placed(env, namespace, "mine")
    def untouched() -> None:
        obj = get(env.manager, namespace, "local")
        assert obj["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"], (
            "the dispatcher wrote to a TrainJob it does not manage")
        assert not obj["metadata"].get("finalizers") and placement(obj) is None
        assert remotes(env, namespace, "local") == {}, "a training-operator job was mirrored"
        managers = {m["manager"] for m in obj["metadata"].get("managedFields") or []}
        assert not any("dispatcher" in m for m in managers)

    holds_for(untouched, seconds=3)


def test_a_same_named_object_without_our_label_is_never_touched(dispatch_env, namespace):
    env = dispatch_env
    worker2 = env.multicluster["worker-2"]
    # Someone else's copy (e.g. another manager's, with another origin): its managedBy
    # keeps the worker's operator away too, so any write to it would be ours.
    foreign = create(worker2, namespace, trainjob("taken"))
    # worker-2 is the better fit by capacity (needs 20 cpu; worker-1 has 16).
    create(env.manager, namespace, trainjob("taken", requests={"cpu": "20"}))
    # Nowhere else fits: the job waits, saying why worker-2 was given up.
    wait_pending(env, namespace, "taken", "worker-2: TrainJob",
                 "not a copy made by this dispatcher")
    assert placement(get(env.manager, namespace, "taken")) is None
    after = get(worker2, namespace, "taken")
    assert after["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]
    assert c.MULTIKUEUE_ORIGIN_LABEL not in (after["metadata"].get("labels") or {})


def test_capacity_decides(dispatch_env, namespace):
    env = dispatch_env
    # 2 nodes x 20 cpu = 40 cpu: only worker-2 (64 cpu) has room.
    create(env.manager, namespace, trainjob("big", num_nodes=2, requests={"cpu": "20"}))
    worker, _ = wait_placed(env, namespace, "big")
    assert worker == "worker-2"


def test_a_worker_without_the_runtime_is_not_eligible(dispatch_env, namespace):
    env = dispatch_env
    only_here = f"only-worker-1-{namespace}"
    fixtures.install_runtime(env.multicluster["worker-1"].api,
                             fixtures.torch_runtime(only_here, cpu="100m"))
    try:
        create(env.manager, namespace, trainjob("picky", runtime=only_here))
        worker, _ = wait_placed(env, namespace, "picky")
        assert worker == "worker-1"
    finally:
        env.multicluster["worker-1"].custom.delete_cluster_custom_object(
            *TRAINER, c.CLUSTERTRAININGRUNTIMES, only_here)


def test_pending_with_reasons_then_placed_when_a_node_appears(dispatch_env, namespace):
    env = dispatch_env
    resource = f"example.com/{namespace}"
    create(env.manager, namespace, trainjob("waits", requests={"cpu": "100m", resource: "2"}))
    wait_pending(env, namespace, "waits", *(f"{worker}: needs 2 {resource}, 0 free"
                                             for worker in ("worker-1", "worker-2")))
    # Events are recorded asynchronously, after the condition write.
    eventually(
        lambda: [(e.type, e.reason) for e in env.manager.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=waits").items],
        lambda seen: ("Warning", "NoWorkerFits") in seen,
        expected="a Warning NoWorkerFits Event on the TrainJob")

    node = f"extra-{namespace}"
    fixtures.add_node(env.multicluster["worker-1"].api, node,
                      {"cpu": "8", "memory": "16Gi", resource: "4"})
    try:
        worker, _ = wait_placed(env, namespace, "waits")
        assert worker == "worker-1"
    finally:
        env.multicluster["worker-1"].core.delete_node(node)


def test_a_burst_spreads_instead_of_overcommitting(dispatch_env, namespace):
    env = dispatch_env
    resource = f"example.com/{namespace}"
    nodes = {"worker-1": 6, "worker-2": 4}
    for worker, amount in nodes.items():
        fixtures.add_node(env.multicluster[worker].api, f"burst-{namespace}",
                          {"cpu": "8", "memory": "16Gi", resource: str(amount)})
    try:
        for i in range(20):
            create(env.manager, namespace, trainjob(f"b{i}", requests={"cpu": "10m",
                                                                        resource: "1"}))

        def observe():
            placed = {}
            for i in range(20):
                where = placement(get(env.manager, namespace, f"b{i}"))
                if where:
                    placed[f"b{i}"] = where
            return placed

        placed = eventually(observe, lambda p: len(p) >= 10,
                            expected="10 of 20 jobs placed (all the room there is)")
        per_worker = {w: sum(1 for v in placed.values() if v == w) for w in nodes}
        assert per_worker == nodes, f"expected {nodes} jobs per worker, saw {per_worker}"
        # The other ten wait, each saying why.
        waiting = [f"b{i}" for i in range(20) if f"b{i}" not in placed]
        for name in waiting:
            obj = eventually(lambda n=name: get(env.manager, namespace, n),
                             lambda o: (condition(o, "Placed") or {}).get("reason") ==
                             "NoWorkerFits", expected=f"{name} pending with reasons")
            assert placement(obj) is None
    finally:
        for worker in nodes:
            env.multicluster[worker].core.delete_node(f"burst-{namespace}")


def test_suspend_after_dispatch_removes_the_remote_and_resume_places_again(dispatch_env,
                                                                          namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("pause"))
    wait_placed(env, namespace, "pause")
    env.manager.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "pause", {"spec": {"suspend": True}},
        _content_type="application/merge-patch+json")
    eventually(lambda: (remotes(env, namespace, "pause"), get(env.manager, namespace, "pause")),
               lambda seen: seen[0] == {} and placement(seen[1]) is None
               and not seen[1]["metadata"].get("finalizers"),
               expected="remote deleted, placement and finalizer cleared while suspended")
    env.manager.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "pause", {"spec": {"suspend": False}},
        _content_type="application/merge-patch+json")
    wait_placed(env, namespace, "pause")


def test_deleting_on_the_manager_removes_the_remote_and_its_jobset(dispatch_env, namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("gone"))
    worker_name, _ = wait_placed(env, namespace, "gone")
    worker = env.multicluster[worker_name]
    jobsets = (c.JOBSET_GROUP, c.JOBSET_VERSION)
    eventually(lambda: get(worker, namespace, "gone", c.JOBSETS, jobsets),
               lambda js: js is not None, expected="the worker's JobSet for gone")
    env.manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, "gone")
    eventually(lambda: (get(env.manager, namespace, "gone"), get(worker, namespace, "gone"),
                        get(worker, namespace, "gone", c.JOBSETS, jobsets)),
               lambda seen: seen == (None, None, None),
               expected="manager job, remote copy and JobSet all gone")


def test_restarting_the_dispatcher_keeps_exactly_one_remote_per_job(dispatch_env, namespace):
    env = dispatch_env
    names = [f"r{i}" for i in range(6)]
    for name in names[:3]:
        create(env.manager, namespace, trainjob(name))
    env.restart_dispatcher(kill=True)
    for name in names[3:]:
        create(env.manager, namespace, trainjob(name))
    env.restart_dispatcher(kill=True)
    for name in names:
        worker, remote = wait_placed(env, namespace, name)
        assert len(remotes(env, namespace, name)) == 1
    # Still exactly one copy each after a further restart, with the same UIDs.
    uids = {n: list(remotes(env, namespace, n).values())[0]["metadata"]["uid"] for n in names}
    env.restart_dispatcher(kill=True)
    for name in names:
        copies = remotes(env, namespace, name)
        assert [x["metadata"]["uid"] for x in copies.values()] == [uids[name]]


def test_an_insecure_kubeconfig_is_reported_and_nothing_crashes(dispatch_env, namespace):
    env = dispatch_env
    name = f"insecure-{namespace}"
    config = yaml.safe_load(env.multicluster["worker-1"].kubeconfig.read_text())
    config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=f"{name}-kubeconfig",
                                                          namespace="kueue-system"),
                             data={"kubeconfig": base64.b64encode(
                                 yaml.safe_dump(config).encode()).decode()})
    env.manager.core.create_namespaced_secret("kueue-system", secret)
    custom = env.manager.custom
    custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "multikueueclusters", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
        "metadata": {"name": name},
        "spec": {"clusterSource": {"kubeConfig": {"location": f"{name}-kubeconfig"}}}})
    # Listed in the config, so the dispatcher considers it.
    fixtures.register_config(env.manager.api, "e2e", ["worker-1", "worker-2", name])
    try:
        obj = eventually(
            lambda: custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                     "multikueueclusters", name),
            lambda o: any(x.get("type") == "Active" for x in (o.get("status") or {}).get(
                "conditions") or []),
            expected=f"an Active condition on MultiKueueCluster {name}")
        active = next(x for x in obj["status"]["conditions"] if x["type"] == "Active")
        assert (active["status"], active["reason"]) == ("False", "InsecureKubeConfig")
        assert "insecure-skip-tls-verify" in active["message"]
        assert env.dispatcher.readyz()[0] == 200
        # And the dispatcher still dispatches.
        create(env.manager, namespace, trainjob("still-works"))
        wait_placed(env, namespace, "still-works")
    finally:
        fixtures.register_config(env.manager.api, "e2e", ["worker-1", "worker-2"])
        custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                            "multikueueclusters", name)
        env.manager.core.delete_namespaced_secret(f"{name}-kubeconfig", "kueue-system")


@pytest.mark.parametrize("count", [20])
def test_dispatch_and_sync_latency_over_many_jobs(dispatch_env, namespace, count):
    """Measures (and prints) creation -> remote exists and remote status -> manager status."""
    env = dispatch_env
    # One job at a time, so each figure is that job's own latency, not time spent waiting
    # for the test to finish creating the others.
    dispatch = []
    for i in range(count):
        name = f"l{i}"
        started = time.monotonic()
        create(env.manager, namespace, trainjob(name))
        eventually(lambda n=name: remotes(env, namespace, n), bool, interval=0.005,
                   expected=f"a remote copy of {name}")
        dispatch.append(time.monotonic() - started)
    dispatch.sort()
    # Status: flip each remote's JobSet to Completed and time the manager showing it.
    lags = []
    for i in range(count):
        name = f"l{i}"
        worker = env.multicluster[placement(get(env.manager, namespace, name))]
        eventually(lambda: get(worker, namespace, name, c.JOBSETS,
                               (c.JOBSET_GROUP, c.JOBSET_VERSION)), lambda js: js is not None,
                   expected=f"JobSet {name} on {worker.name}")
        complete_jobset(worker, namespace, name)
        remote = eventually(lambda: get(worker, namespace, name),
                            lambda o: o is None or condition(o, "Complete") is not None,
                            expected=f"remote {name} Complete", interval=0.005)
        started = time.monotonic()
        eventually(lambda: get(env.manager, namespace, name),
                   lambda o: condition(o, "Complete") is not None,
                   expected=f"manager {name} Complete", interval=0.005)
        if remote is not None:
            lags.append(time.monotonic() - started)
    print(f"\ndispatch latency over {count} jobs: median {dispatch[count // 2] * 1000:.0f} ms,"
          f" worst {dispatch[-1] * 1000:.0f} ms")
    if lags:
        lags.sort()
        print(f"status sync (remote Complete seen -> manager Complete seen) over {len(lags)}: "
              f"median {lags[len(lags) // 2] * 1000:.0f} ms, worst {lags[-1] * 1000:.0f} ms")
    assert dispatch[-1] < stretched(30), (
        f"slowest dispatch took {dispatch[-1]:.1f}s ({machine_load()})")


def test_a_remote_deleted_by_someone_else_is_recorded_and_placed_again(dispatch_env,
                                                                      namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("victim"))
    worker_name, remote = wait_placed(env, namespace, "victim")
    eventually(lambda: get(env.manager, namespace, "victim"),
               lambda obj: (condition(obj, "Created") or {}).get("status") == "True",
               expected="the worker's status mirrored before the copy is deleted")
    env.multicluster[worker_name].custom.delete_namespaced_custom_object(
        *TRAINER, namespace, c.TRAINJOBS, "victim")
    events = eventually(
        lambda: env.manager.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=victim").items,
        lambda items: any(e.reason == "RemoteDeleted" for e in items),
        expected="a RemoteDeleted Event on the manager TrainJob")
    assert any("deleted by someone else" in e.message for e in events)
    _, again = wait_placed(env, namespace, "victim")
    assert again["metadata"]["uid"] != remote["metadata"]["uid"], "expected a new copy"


def test_a_worker_added_at_runtime_is_used(dispatch_env, namespace):
    env = dispatch_env
    fixtures.register_config(env.manager.api, "e2e", ["worker-1"])
    try:
        # 40 cpu fit only on worker-2, which is not a candidate right now.
        create(env.manager, namespace, trainjob("later", num_nodes=2,
                                                requests={"cpu": "20"}))
        pending = eventually(
            lambda: get(env.manager, namespace, "later"),
            lambda obj: (condition(obj, "Placed") or {}).get("reason") == "NoWorkerFits",
            expected="pending while only worker-1 is configured")
        assert "worker-2" not in condition(pending, "Placed")["message"]
    finally:
        fixtures.register_config(env.manager.api, "e2e", ["worker-1", "worker-2"])
    worker, _ = wait_placed(env, namespace, "later")
    assert worker == "worker-2"


def test_api_writes_per_dispatched_job(dispatch_env, namespace):
    """Counted from each apiserver's own metrics: placement + finalizer in one manager
    write, the remote create, one manager write per remote status change, and at the end
    the remote delete and the finalizer release."""
    from clusters.testing import apiserver_writes

    env = dispatch_env
    resources = {(c.TRAINER_GROUP, c.TRAINJOBS), ("", "events")}
    verbs = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
    wait_no_namespace_terminating(env)
    before = {cl.name: apiserver_writes(cl, resources, verbs) for cl in env.multicluster}
    # Real pods that succeed a second after they start, so the copy's status goes through
    # every state a job has.
    create(env.manager, namespace, trainjob("counted", runtime=QUICK_RUNTIME))
    worker_name, _ = wait_placed(env, namespace, "counted")
    eventually(lambda: (get(env.manager, namespace, "counted"), remotes(env, namespace, "counted")),
               lambda seen: seen[1] == {} and not seen[0]["metadata"].get("finalizers")
               and (condition(seen[0], "Complete") or {}).get("status") == "True",
               expected="completed, remote deleted, finalizer released", timeout=90)
    eventually(lambda: env.manager.core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=counted").items,
        lambda items: any(e.reason == "Placed" for e in items), expected="the Placed Event")
    after = {cl.name: apiserver_writes(cl, resources, verbs) for cl in env.multicluster}
    delta = {name: {k: v - before[name].get(k, 0) for k, v in after[name].items()
                    if v != before[name].get(k, 0)} for name in after}
    print(f"\nAPI writes for one dispatched job (creation to Complete): {delta}")
    manager = delta["manager"]
    remote = delta[worker_name]
    assert manager.get(("trainjobs", "", "POST")) == 1  # the test's own create
    assert manager.get(("trainjobs", "", "PATCH")) == 2, manager  # placement, finalizer release
    # At most one manager status write per status the copy went through (the operator
    # writes each distinct status once; changes close together may arrive as one), and at
    # least Created and Complete.
    remote_statuses = remote.get(("trainjobs", "status", "PATCH"))
    assert 2 <= manager.get(("trainjobs", "status", "PUT")) <= remote_statuses, (manager, remote)
    assert manager.get(("events", "", "POST")) == 1, manager  # Placed
    assert remote.get(("trainjobs", "", "POST")) == 1, remote  # the copy
    assert remote.get(("trainjobs", "", "DELETE")) == 1, remote  # removed after completion


def test_invalid_configuration_fails_at_start_naming_the_key(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "dispatcher.yaml"
    path.write_text("client:\n  qps: -1\n")
    result = subprocess.run([sys.executable, "-m", "dispatcher", "run", "--config", str(path),
                             "--kubeconfig", "/nonexistent"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "config key 'client.qps'" in result.stderr and "greater than 0" in result.stderr


def test_a_changed_kubeconfig_secret_takes_effect_without_a_restart(dispatch_env):
    env = dispatch_env
    core = env.manager.core
    secret = core.read_namespaced_secret("worker-2-kubeconfig", "kueue-system")
    original = dict(secret.data)
    config = yaml.safe_load(base64.b64decode(original["kubeconfig"]))
    config["users"][0]["user"] = {"exec": {"command": "get-token",
                                           "apiVersion": "client.authentication.k8s.io/v1"}}
    mk = ("kueue.x-k8s.io", "v1beta2", "multikueueclusters")

    def active():
        obj = env.manager.custom.get_cluster_custom_object(*mk, "worker-2")
        return next((x for x in (obj.get("status") or {}).get("conditions") or []
                     if x["type"] == "Active"), {})

    core.patch_namespaced_secret("worker-2-kubeconfig", "kueue-system", {"data": {
        "kubeconfig": base64.b64encode(yaml.safe_dump(config).encode()).decode()}})
    try:
        refused = eventually(active, lambda cond: cond.get("reason") == "InsecureKubeConfig",
                             expected="worker-2 Active=False InsecureKubeConfig")
        assert refused["status"] == "False" and "exec" in refused["message"]
    finally:
        core.patch_namespaced_secret("worker-2-kubeconfig", "kueue-system",
                                     {"data": original})
    eventually(active, lambda cond: cond.get("status") == "True", timeout=30,
               expected="worker-2 Active=True again with the restored Secret")


def test_status_command_lists_clusters_and_jobs_from_the_manager(dispatch_env, namespace):
    import json
    import subprocess
    import sys

    env = dispatch_env
    create(env.manager, namespace, trainjob("shown"))
    worker, _ = wait_placed(env, namespace, "shown")
    create(env.manager, namespace, trainjob("local", managed_by=None))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dispatcher", "status", "--kubeconfig",
                               str(env.manager.kubeconfig), *args],
                              capture_output=True, text=True, timeout=120)

    result = run("-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {(x["name"], x["active"]) for x in report["clusters"]} >= {
        ("worker-1", "True"), ("worker-2", "True")}
    ours = [x for x in report["trainJobs"] if x["namespace"] == namespace]
    assert [(x["name"], x["worker"]) for x in ours] == [("shown", worker)]  # not "local"
    table = run().stdout
    assert "CLUSTER" in table and "TRAINJOB" in table
    assert next(line for line in table.splitlines() if " shown " in line).split()[2] == worker


@contextlib.contextmanager
def registered_by_path(env, name: str, location: str):
    """A MultiKueueCluster ``name`` whose kubeconfig is the file ``location``, in the
    MultiKueueConfig for the duration."""
    env.manager.custom.create_cluster_custom_object(*MK, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
        "metadata": {"name": name},
        "spec": {"clusterSource": {"kubeConfig": {"location": location,
                                                  "locationType": "Path"}}}})
    fixtures.register_config(env.manager.api, "e2e", ["worker-1", "worker-2", name])
    try:
        yield
    finally:
        fixtures.register_config(env.manager.api, "e2e", ["worker-1", "worker-2"])
        env.manager.custom.delete_cluster_custom_object(*MK, name)


def test_a_kubeconfig_given_by_path_is_used(dispatch_env, namespace):
    env = dispatch_env
    name = f"by-path-{namespace}"[:60]
    with registered_by_path(env, name, str(env.multicluster["worker-2"].kubeconfig)):
        # It reaches worker-2 (a cluster already registered): only a connection through
        # the file could tell it is the same cluster, so the refusal proves the file used.
        refused = eventually(
            lambda: active(env, name), lambda cond: cond.get("reason") == "DuplicateRegistration",
            expected=f"{name} (kubeconfig from a file path) connected and refused as a second "
                     "registration of worker-2")
        assert refused["status"] == "False" and "worker-2" in refused["message"], refused


def test_a_path_outside_the_kubeconfig_dirs_is_refused(dispatch_env, namespace):
    """Path locations are confined to --kubeconfig-dir: a file elsewhere is never read
    (anyone who may write MultiKueueClusters could otherwise make it read any file)."""
    env = dispatch_env
    name = f"outside-{namespace}"[:60]
    with registered_by_path(env, name, "/etc/hostname"):
        refused = eventually(lambda: active(env, name),
                             lambda cond: cond.get("reason") == "BadKubeConfig",
                             expected=f"{name} Active=False BadKubeConfig (Path outside)")
        assert "/etc/hostname: outside the directories" in refused["message"], refused


def test_metrics_count_jobs_requests_and_latencies(dispatch_env, namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("metered"))
    wait_placed(env, namespace, "metered")
    leader = env.dispatcher
    _, text = leader.get("/metrics")
    for family in ("dispatcher_dispatch_latency_seconds_bucket",
                   "dispatcher_status_sync_lag_seconds_bucket", "dispatcher_cluster_active",
                   "dispatcher_jobs{", 'dispatcher_api_requests_total{cluster="manager"',
                   'dispatcher_api_requests_total{cluster="worker-1"',
                   "dispatcher_gc_deletions_total", "dispatcher_reconcile_errors_total"):
        assert family in text, f"{family} missing from /metrics"
    assert leader.metric("dispatcher_jobs") >= 1
    assert leader.metric("dispatcher_api_requests_total") > 0


def test_both_processes_serve_the_controller_runtime_metrics(dispatch_env, namespace):
    """The names Go controllers' dashboards and alerts use, with process and Python
    metrics, on each process's one registry: the dispatcher (leader, standalone mode) and
    the operator on the worker the job went to. The dispatcher here has a 3 s Lease: one
    that loses it on a loaded machine is started again, and the new process's counters
    start at zero, so the job is made again then (at most three times)."""
    env = dispatch_env
    attempts = 3
    for attempt in range(attempts):
        restarts = env.dispatcher.lease_restarts
        try:
            _metrics_after_a_job(env, namespace, f"standard-{attempt}")
            return
        except (AssertionError, OSError):
            if env.dispatcher.lease_restarts == restarts or attempt == attempts - 1:
                raise


def _metrics_after_a_job(env, namespace: str, name: str) -> None:
    create(env.manager, namespace, trainjob(name))
    worker_name, _ = wait_placed(env, namespace, name)
    worker = env.multicluster[worker_name]
    eventually(lambda: get(worker, namespace, name, c.JOBSETS,
                           (c.JOBSET_GROUP, c.JOBSET_VERSION)),
               lambda found: found is not None,
               expected=f"the operator on {worker_name} to create JobSet {namespace}/{name}")
    worker_host = urlsplit(worker.api.configuration.host).netloc
    operator = env.operators[worker_name]
    for process, controller in ((env.dispatcher, "trainjob-dispatcher"),
                                (operator, "trainjob")):
        assert process.metric("process_cpu_seconds_total") > 0
        assert process.metric("process_resident_memory_bytes") > 0
        assert process.metric("python_info") == 1
        assert process.metric("workqueue_adds_total", name=controller,
                              controller=controller) > 0
        assert process.metric("workqueue_queue_duration_seconds_count", name=controller) > 0
        assert process.metric("controller_runtime_max_concurrent_reconciles",
                              controller=controller) > 0
        # A reconcile is counted once it returns, a moment after its write.
        eventually(lambda: process.metric("controller_runtime_reconcile_total",
                                          controller=controller, result="success"),
                   lambda count: count > 0,
                   expected=f"successful {controller} reconciles counted")
        assert process.metric("controller_runtime_reconcile_time_seconds_count",
                              controller=controller) > 0
        # The dispatcher created the copy on the worker, the operator its JobSet there.
        assert process.metric("rest_client_requests_total", code="201", method="POST",
                              host=worker_host) > 0, f"{controller}: no POST to {worker_host}"
        assert process.metric("rest_client_request_duration_seconds_count", verb="POST",
                              host=worker_host) > 0
    assert env.dispatcher.metric("leader_election_master_status",
                                 name=f"trainjob-dispatcher-{c.DEFAULT_ORIGIN}") == 1
    # The dispatcher's worker clients are rate limited; the operator's client is not.
    assert env.dispatcher.metric("rest_client_rate_limiter_duration_seconds_count",
                                 verb="POST", host=worker_host) > 0
    assert operator.metric("rest_client_rate_limiter_duration_seconds_count") == 0
    _, text = operator.get("/metrics")
    assert "\nleader_election_master_status{" not in text  # no --leader-elect here


def test_log_lines_about_a_job_name_it_and_its_cluster(dispatch_env, namespace):
    env = dispatch_env
    create(env.manager, namespace, trainjob("logged"))
    worker, _ = wait_placed(env, namespace, "logged")
    suffix = f"namespace={namespace} name=logged cluster={worker}"
    # Every line the reconcile of this job wrote after placing it (debug level here).
    lines = eventually(
        lambda: [line for line in env.dispatcher.log_file.read_text(errors="replace")
                 .splitlines() if f"{namespace}/logged" in line],
        lambda found: any("placed on" in line for line in found),
        expected=f"a 'placed on' line about {namespace}/logged in the dispatcher log")
    placed = next(line for line in lines if "placed on" in line)
    assert placed.endswith(suffix), placed
    # The same line says where the dispatch's time went, in a form the benchmark reads.
    logged = dispatch_log.read(env.dispatcher.log_file, namespace)
    assert set(logged) == {(namespace, "logged")}, (placed, logged)
    steps = logged[(namespace, "logged")]
    assert list(steps) == ["queue", "decide", "place", "patch", "create", "decide_cpu",
                           "place_cpu", "patch_cpu", "create_cpu"], (placed, steps)
    assert steps["patch"] > 0 and steps["create"] > 0, (placed, steps)
    # CPU is the reconciling thread's: never more than the step's wall time.
    assert all(steps[f"{step}_cpu"] <= steps[step] + 0.0001
               for step in ("decide", "place", "patch", "create")), (placed, steps)


def test_a_pending_job_is_not_reconciled_over_and_over(dispatch_env, namespace):
    """A job no worker can hold waits for an event that may change that: the reconcile
    that finds it still pending does not put it straight back on the queue. Counted from
    the dispatcher's debug line per reconcile of this job, once the earlier tests' jobs and
    pods are gone: each one that ends frees room, and the dispatcher rightly looks at the
    pending job again (with `make test`'s two processes, clean-up takes longer)."""
    env = dispatch_env
    create(env.manager, namespace, trainjob("too-big", requests={"cpu": "1000"}))
    eventually(lambda: get(env.manager, namespace, "too-big"),
               lambda obj: (condition(obj, "Placed") or {}).get("reason") == "NoWorkerFits",
               expected="Placed=False NoWorkerFits on a job no worker can hold")

    def clean_up_going() -> list[str]:
        # A manager TrainJob being deleted has its copy, then that copy's pods, deleted.
        going = [f"manager/{o['metadata']['namespace']}/{o['metadata']['name']}"
                 for o in env.manager.custom.list_cluster_custom_object(
                     c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS)["items"]
                 if o["metadata"].get("deletionTimestamp")]
        for worker in env.multicluster.workers:
            ending = {ns.metadata.name for ns in worker.core.list_namespace().items
                      if ns.metadata.deletion_timestamp}
            going += [f"{worker.name}/{pod.metadata.namespace}/{pod.metadata.name}"
                      for pod in worker.core.list_pod_for_all_namespaces().items
                      if pod.metadata.deletion_timestamp or pod.metadata.namespace in ending]
        return going

    eventually(clean_up_going, lambda going: not going, timeout=120,
               expected="no TrainJob being deleted on the manager and no pod being deleted on "
                        "the workers (earlier tests' clean-up)")
    marker = f"TrainJob {namespace}/too-big: "

    def reconciles() -> int:
        return sum(marker in line for line in
                   env.dispatcher.log_file.read_text(errors="replace").splitlines())

    start = reconciles()
    holds_for(reconciles, lambda count: count - start < 10, seconds=3,
              expected=f"fewer than 10 reconciles of {namespace}/too-big in 3 s of waiting "
                       f"(from {start})")


SWEEP_LINE = re.compile(r"full garbage collection: [0-9.]+ ms, [0-9]+ unreachable objects "
                        r"reclaimed, [0-9]+ objects frozen")


def test_frozen_objects_are_swept_at_the_interval_given(dispatch_env, namespace):
    """The dispatcher and the operators here run with --python-gc-sweep-interval 5: each
    logs a full collection once its caches have synced and one every 5 s after, and jobs
    are dispatched and run meanwhile."""
    env = dispatch_env
    logs = {"dispatcher": env.dispatcher.log_file,
            **{f"operator on {name}": process.log_file
               for name, process in env.operators.items()}}

    def sweeps() -> dict[str, int]:
        return {who: len(SWEEP_LINE.findall(path.read_text(errors="replace")))
                for who, path in logs.items()}

    # The start-up sweep follows the caches' sync, so it may come just after /readyz.
    before = eventually(sweeps, lambda now: all(count >= 1 for count in now.values()),
                        timeout=30, expected="each controller's start-up sweep logged")
    create(env.manager, namespace, trainjob("swept", runtime=QUICK_RUNTIME))
    wait_placed(env, namespace, "swept")
    eventually(sweeps, lambda now: all(now[who] >= before[who] + 2 for who in now),
               timeout=6 * PYTHON_GC_SWEEP_SECONDS,
               expected=f"two more sweeps logged by each controller than the {before} "
                        "before, one every 5 s")
