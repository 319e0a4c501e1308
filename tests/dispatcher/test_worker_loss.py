"""A worker that stops answering: briefly (nothing moves, sync resumes) and for longer than
the worker-lost timeout (the job moves; the stale copy goes when the worker returns).

The dispatcher here runs with a short worker-lost timeout and a 2 s garbage-collection
interval (see conftest); the tests of a worker lost for good run last, with a shorter one
(``quick_loss``)."""

from __future__ import annotations

import time

import pytest

from clusters.machine_load import machine_load
from clusters.testing import eventually
from controller_kit.api_time import parse_time

from dispatch_helpers import (
    active,
    complete_jobset,
    condition,
    create,
    get,
    idle_workers,
    placement,
    remotes,
    trainjob,
    wait_placed,
)

# The worker-lost timeout of the tests that wait for it to pass. dispatch_env's must outlast
# the harness's stop and start of a worker (up to a minute on a busy machine), so that a
# short outage moves nothing; these tests restart no worker before the timeout, so theirs
# need only outlast a slow answer from a worker that is up.
QUICK_LOST_TIMEOUT = 15


@pytest.fixture(scope="module")
def quick_loss(dispatch_env):
    """dispatch_env with its dispatcher restarted once with ``QUICK_LOST_TIMEOUT``, for the
    rest of the module (its last tests ask for it)."""
    env = dispatch_env
    args = list(env.dispatcher.extra_args)
    args[args.index("--worker-lost-timeout") + 1] = str(QUICK_LOST_TIMEOUT)
    env.dispatcher.extra_args = tuple(args)
    env.restart_dispatcher(kill=False)
    env.worker_lost_timeout = QUICK_LOST_TIMEOUT
    return env


def test_a_short_outage_moves_nothing_and_sync_resumes(dispatch_env, namespace):
    env = dispatch_env
    idle_workers(env)
    create(env.manager, namespace, trainjob("steady"))  # small: best fit puts it on worker-1
    worker_name, remote = wait_placed(env, namespace, "steady")
    assert worker_name == "worker-1"
    eventually(lambda: get(env.manager, namespace, "steady"),
               lambda obj: (condition(obj, "Created") or {}).get("status") == "True",
               expected="the worker's status mirrored")
    stopped_at = time.monotonic()
    env.multicluster.stop("worker-1")
    try:
        inactive = eventually(lambda: active(env, "worker-1"),
                              lambda cond: cond.get("status") == "False", timeout=15,
                              expected="worker-1 Active=False within seconds")
        assert inactive["reason"] == "ClientConnectionFailed"
        detected = time.monotonic() - stopped_at
        held = eventually(lambda: get(env.manager, namespace, "steady"),
                          lambda obj: (condition(obj, "WorkerReachable") or {}).get(
                              "status") == "False",
                          expected="a WorkerReachable=False condition on the manager job")
        assert "unreachable since" in condition(held, "WorkerReachable")["message"]
        assert (condition(held, "Created") or {}).get("status") == "True", \
            "the last status must be kept while the worker is away"
        assert placement(held) == "worker-1"
    finally:
        env.multicluster.start("worker-1")
    back = eventually(lambda: active(env, "worker-1"),
                      lambda cond: cond.get("status") == "True", timeout=30,
                      expected="worker-1 Active=True again")
    # The outage as the dispatcher saw it, from its own condition's transitions: its
    # worker-lost timer runs from the first to the second. (The harness's stop and start
    # take longer on a busy machine, start-up waiting for every component.)
    seen = parse_time(back["lastTransitionTime"]) - parse_time(inactive["lastTransitionTime"])
    assert seen < env.worker_lost_timeout, (
        f"the outage the dispatcher saw ({seen:.0f}s: Active=False at "
        f"{inactive['lastTransitionTime']}, True at {back['lastTransitionTime']}) outlasted "
        f"the worker-lost timeout of {env.worker_lost_timeout}s ({machine_load()})")
    print(f"\nworker-1 seen inactive {detected:.1f}s after it stopped; the dispatcher saw "
          f"it away for {seen:.0f}s, the harness for {time.monotonic() - stopped_at:.1f}s")
    complete_jobset(env.multicluster["worker-1"], namespace, "steady")
    done = eventually(lambda: get(env.manager, namespace, "steady"),
                      lambda obj: (condition(obj, "Complete") or {}).get("status") == "True",
                      expected="status sync resumed: Complete on the manager")
    assert placement(done) == "worker-1", "nothing may be re-dispatched after a short outage"
    assert condition(done, "WorkerReachable") is None, "the whole remote status replaced ours"
    assert set(remotes(env, namespace, "steady")) <= {"worker-1"}, "a copy appeared elsewhere"


def test_the_unreachable_condition_clears_when_the_worker_answers_again(dispatch_env,
                                                                        namespace):
    """A copy that has not reported any status yet (here: its worker's operator is down):
    once the worker answers again, the manager loses WorkerReachable=False within seconds,
    without waiting for the copy's status to change."""
    env = dispatch_env
    idle_workers(env)
    operator = env.operators["worker-1"]
    operator.stop()
    try:
        create(env.manager, namespace, trainjob("quiet"))  # small: best fit puts it on worker-1
        worker_name, remote = wait_placed(env, namespace, "quiet")
        assert worker_name == "worker-1" and not remote.get("status"), remote
        env.multicluster.stop("worker-1")
        try:
            eventually(lambda: get(env.manager, namespace, "quiet"),
                       lambda obj: (condition(obj, "WorkerReachable") or {}).get("status")
                       == "False", timeout=30,
                       expected="WorkerReachable=False on the manager job")
        finally:
            env.multicluster.start("worker-1")
        back = eventually(lambda: active(env, "worker-1"),
                          lambda cond: cond.get("status") == "True", timeout=30,
                          expected="worker-1 Active=True again")
        cleared = eventually(lambda: get(env.manager, namespace, "quiet"),
                             lambda obj: condition(obj, "WorkerReachable") is None, timeout=10,
                             expected="WorkerReachable gone from the manager job within "
                                      "seconds of worker-1 answering")
        assert placement(cleared) == "worker-1", (
            f"the job moved off worker-1 (Active again at {back['lastTransitionTime']}); only "
            f"{env.worker_lost_timeout}s unreachable may move it")
    finally:
        env.operators["worker-1"] = operator.start()


def test_a_lost_worker_s_jobs_move_and_its_stale_copy_is_removed_on_return(quick_loss,
                                                                           namespace):
    env = quick_loss
    idle_workers(env)
    create(env.manager, namespace, trainjob("mover"))
    worker_name, old_copy = wait_placed(env, namespace, "mover")
    assert worker_name == "worker-1"
    env.multicluster.stop("worker-1")
    try:
        moved = eventually(lambda: get(env.manager, namespace, "mover"),
                           lambda obj: placement(obj) == "worker-2",
                           timeout=env.worker_lost_timeout + 60,
                           expected="the job placed again on worker-2 after the timeout")
        assert moved is not None
        eventually(lambda: get(env.multicluster["worker-2"], namespace, "mover"),
                   lambda obj: obj is not None, expected="a copy on worker-2")
        eventually(
            lambda: [e.reason for e in env.manager.core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=mover").items],
            lambda reasons: "WorkerLost" in reasons,
            expected="a WorkerLost Event on the TrainJob")
    finally:
        env.multicluster.start("worker-1")
    # Back again: the stale copy (ours, manager now points at worker-2) is collected.
    eventually(lambda: get(env.multicluster["worker-1"], namespace, "mover"),
               lambda obj: obj is None, timeout=60,
               expected="the stale copy on worker-1 deleted by garbage collection")
    assert list(remotes(env, namespace, "mover")) == ["worker-2"]
    assert old_copy["metadata"]["uid"] != get(env.multicluster["worker-2"], namespace,
                                              "mover")["metadata"]["uid"]


def test_deleting_a_job_whose_worker_is_down_finishes_after_the_timeout(quick_loss,
                                                                        namespace):
    env = quick_loss
    idle_workers(env)
    create(env.manager, namespace, trainjob("orphan"))
    worker_name, _ = wait_placed(env, namespace, "orphan")
    assert worker_name == "worker-1"
    env.multicluster.stop("worker-1")
    try:
        eventually(lambda: active(env, "worker-1"),
                   lambda cond: cond.get("status") == "False", timeout=15,
                   expected="worker-1 seen inactive")
        env.manager.custom.delete_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "orphan")
        # Held by the finalizer while the copy cannot be deleted, but not forever.
        assert get(env.manager, namespace, "orphan") is not None
        eventually(lambda: get(env.manager, namespace, "orphan"), lambda obj: obj is None,
                   timeout=env.worker_lost_timeout + 60,
                   expected="deletion finished after the worker-lost timeout")
    finally:
        env.multicluster.start("worker-1")
    eventually(lambda: get(env.multicluster["worker-1"], namespace, "orphan"),
               lambda obj: obj is None, timeout=60,
               expected="the copy left on worker-1 collected once it answers again")
