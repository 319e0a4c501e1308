"""Worker registrations that could make a job run twice: one cluster registered under two
names, and a worker leaving the registry while jobs run on it.

The dispatcher here sweeps for garbage every 2 s (see conftest), so a sweep that would
delete another registration's copies shows within seconds."""

from __future__ import annotations

from kubernetes import client

from clusters import fixtures
from clusters.testing import eventually
from trainjob import constants as c

from dispatch_helpers import (
    CONFIG,
    MK,
    active,
    copies_at_once,
    create,
    get,
    idle_workers,
    look_at_copies,
    placement,
    remotes,
    trainjob,
    wait_placed,
)

WORKERS = ["worker-1", "worker-2"]


def jobset_uid(env, worker: str, namespace: str, name: str) -> str | None:
    obj = get(env.multicluster[worker], namespace, name, c.JOBSETS,
              (c.JOBSET_GROUP, c.JOBSET_VERSION))
    return obj["metadata"]["uid"] if obj else None


def events(env, namespace: str, name: str, reason: str) -> list[str]:
    return [e.message for e in env.manager.core.list_namespaced_event(namespace).items
            if e.involved_object.name == name and e.reason == reason]


def sweeps(env) -> int:
    """Garbage-collection sweeps the dispatcher has logged so far."""
    return env.dispatcher.log_file.read_text(errors="replace").count("remote copies removed")


def test_one_worker_registered_twice_is_refused_and_its_jobs_stay(dispatch_env, namespace):
    env = dispatch_env
    idle_workers(env)
    create(env.manager, namespace, trainjob("kept"))  # small: best fit puts it on worker-1
    worker, remote = wait_placed(env, namespace, "kept")
    assert worker == "worker-1"
    jobset = eventually(lambda: jobset_uid(env, "worker-1", namespace, "kept"), bool,
                        expected="the copy's JobSet on worker-1")
    # A second Secret made from the same kubeconfig, registered under another name.
    fixtures.register_worker(env.manager.api, "worker-1-again",
                             env.multicluster["worker-1"].kubeconfig)
    fixtures.register_config(env.manager.api, CONFIG, WORKERS + ["worker-1-again"])
    try:
        refused = eventually(lambda: active(env, "worker-1-again"),
                             lambda cond: cond.get("reason") == "DuplicateRegistration",
                             expected="worker-1-again refused as a second registration")
        assert refused["status"] == "False"
        assert "worker-1 " in refused["message"] and "kube-system" in refused["message"], \
            refused["message"]
        assert active(env, "worker-1")["status"] == "True", "the older registration stays"
        eventually(lambda: events(env, "default", "worker-1-again", "DuplicateRegistration"),
                   bool, expected="a DuplicateRegistration Event about worker-1-again")
        # Sweeps that would have deleted the other name's copies: three more of them.
        start = sweeps(env)
        eventually(lambda: sweeps(env), lambda n: n >= start + 3, timeout=30,
                   expected="three garbage-collection sweeps with both registrations")
        copies = remotes(env, namespace, "kept")
        assert list(copies) == ["worker-1"], f"copies: {sorted(copies)}"
        assert copies["worker-1"]["metadata"]["uid"] == remote["metadata"]["uid"], \
            "the copy was deleted and made again"
        assert jobset_uid(env, "worker-1", namespace, "kept") == jobset, \
            "the JobSet was deleted and made again"
        assert placement(get(env.manager, namespace, "kept")) == "worker-1"
        assert "deleted TrainJob" not in env.dispatcher.log_tail(400)
    finally:
        fixtures.register_config(env.manager.api, CONFIG, WORKERS)
        env.manager.custom.delete_cluster_custom_object(*MK, "worker-1-again")
        env.manager.core.delete_namespaced_secret("worker-1-again-kubeconfig", "kueue-system")


def test_a_worker_leaving_the_registry_is_drained_before_its_jobs_move(dispatch_env,
                                                                      namespace):
    env = dispatch_env
    idle_workers(env)
    create(env.manager, namespace, trainjob("mover"))  # small: best fit puts it on worker-1
    worker, remote = wait_placed(env, namespace, "mover")
    assert worker == "worker-1"
    eventually(lambda: jobset_uid(env, "worker-1", namespace, "mover"), bool,
               expected="the copy's JobSet on worker-1")
    fixtures.register_config(env.manager.api, CONFIG, ["worker-2"])  # worker-1 leaves
    try:
        looks = look_at_copies(env, namespace, "mover", lambda c: list(c) == ["worker-2"],
                               expected="the job's only copy on worker-2")
        assert not copies_at_once(looks), copies_at_once(looks)
        assert placement(get(env.manager, namespace, "mover")) == "worker-2"
        # The WorkerRemoved condition lasts only until the copy is confirmed gone (tens of
        # milliseconds here); the Events it came with stay.
        said = eventually(lambda: events(env, namespace, "mover", "WorkerRemoved"),
                          lambda messages: len(messages) >= 2,
                          expected="WorkerRemoved Events: the copy being deleted, then the "
                                   "job placed again")
        assert any("worker-1 left the registry; deleting the copy there" in m
                   for m in said), said
        eventually(lambda: jobset_uid(env, "worker-1", namespace, "mover"),
                   lambda uid: uid is None, expected="the JobSet on worker-1 gone")
    finally:
        fixtures.register_config(env.manager.api, CONFIG, WORKERS)
    idle_workers(env)


def test_a_dispatcher_started_without_a_worker_in_use_drains_it(dispatch_env, namespace):
    """A narrower MultiKueueConfig given at start: the jobs on the worker left out are
    drained the same way, not placed again beside their running copies."""
    env = dispatch_env
    idle_workers(env)
    create(env.manager, namespace, trainjob("restarted"))
    worker, _ = wait_placed(env, namespace, "restarted")
    assert worker == "worker-1"
    fixtures.register_config(env.manager.api, "only-worker-2", ["worker-2"])
    original = env.dispatcher.extra_args
    env.dispatcher.extra_args = tuple(
        "only-worker-2" if arg == CONFIG else arg for arg in original)
    try:
        env.restart_dispatcher()
        looks = look_at_copies(env, namespace, "restarted", lambda c: list(c) == ["worker-2"],
                               expected="the job's only copy on worker-2")
        assert not copies_at_once(looks), copies_at_once(looks)
        moved = get(env.manager, namespace, "restarted")
        assert placement(moved) == "worker-2"
        # Events are written by their own thread, after the reconcile that decided them.
        eventually(lambda: events(env, namespace, "restarted", "WorkerRemoved"), bool,
                   expected=f"a WorkerRemoved Event about {namespace}/restarted")
    finally:
        env.dispatcher.extra_args = original
        env.restart_dispatcher()
        client.CustomObjectsApi(env.manager.api).delete_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "multikueueconfigs", "only-worker-2")
    idle_workers(env)
