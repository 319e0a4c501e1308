"""The dispatcher's decision table (pure): every transition, and the states a crash
between two writes leaves behind."""

from __future__ import annotations

import pytest

from controller_kit.api_time import format_time
from dispatcher.standalone import decisions as d
from trainjob import constants as c

NOW = 1_000_000.0
SETTINGS = d.Settings(origin="multikueue", worker_lost_timeout=60, retention=30)
UID = "manager-uid"


def stamp(seconds_ago: float) -> str:
    return format_time(NOW - seconds_ago)


def manager(placed: str | None = "w1", *, conditions=(), finalizer: bool | None = None,
            suspend=False, deleting=False, managed_by=c.MANAGED_BY_MULTIKUEUE, **status):
    meta = {"name": "job", "namespace": "ns", "uid": UID, "annotations": {},
            "finalizers": []}
    if placed:
        meta["annotations"][c.PLACEMENT_ANNOTATION] = placed
    if finalizer if finalizer is not None else bool(placed):
        meta["finalizers"].append(c.DISPATCH_FINALIZER)
    if deleting:
        meta["deletionTimestamp"] = stamp(1)
    body = {"metadata": meta, "spec": {"managedBy": managed_by, "suspend": suspend}}
    if conditions or status:
        body["status"] = {"conditions": list(conditions), **status}
    return body


def cond(type_, status="True", reason="R", seconds_ago=0.0):
    return {"type": type_, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": stamp(seconds_ago)}


COMPLETE = cond(c.CONDITION_COMPLETE, seconds_ago=100)
CREATED = cond("Created")
# What the manager shows once its copy reported: Placed=True naming the worker.
PLACED = {**cond(c.CONDITION_PLACED, reason=c.REASON_PLACED, seconds_ago=50),
          "message": "placed on worker cluster w1"}


def copy(uid=UID, origin="multikueue", conditions=(), annotated=True):
    annotations = {c.MANAGER_UID_ANNOTATION: uid} if annotated else {}
    body = {"metadata": {"name": "job", "namespace": "ns", "uid": "copy-uid",
                         "labels": {c.MULTIKUEUE_ORIGIN_LABEL: origin},
                         "annotations": annotations}}
    if conditions:
        body["status"] = {"conditions": list(conditions)}
    return body


def worker(remote=None, *, active=True, known=True, draining=False, down_for=0.0):
    return d.WorkerState("w1", known=known, draining=draining, active=active,
                         inactive_since=NOW - down_for, message="connection refused",
                         remote=remote)


def decide(obj, state=None):
    return d.decide(obj, state, NOW, SETTINGS)


# --- the table --------------------------------------------------------------------------

CASES = [
    # (name, manager, worker state, expected action, release)
    ("gone", None, None, d.Forget, False),
    ("not ours", manager(None, managed_by="kubeflow.org/training-operator"), None, d.Ignore,
     False),
    ("new", manager(None), None, d.Place, False),
    ("new but finished", manager(None, conditions=[COMPLETE]), None, d.Ignore, False),
    ("suspended, never placed", manager(None, suspend=True), None, d.Ignore, False),
    ("placed, no copy yet", manager(), worker(), d.CreateRemote, False),
    ("copy without status", manager(), worker(copy()), d.InSync, False),
    ("copy reports", manager(), worker(copy(conditions=[CREATED])), d.CopyStatus, False),
    ("mirrored", manager(conditions=[PLACED, CREATED]), worker(copy(conditions=[CREATED])),
     d.InSync, False),
    ("mirrored, Placed=True not shown yet", manager(conditions=[CREATED]),
     worker(copy(conditions=[CREATED])), d.CopyStatus, False),
    ("copy finished", manager(conditions=[CREATED]), worker(copy(conditions=[COMPLETE])),
     d.CopyStatus, True),
    ("finished, retention over", manager(conditions=[PLACED, COMPLETE]),
     worker(copy(conditions=[COMPLETE])), d.DeleteRemote, True),
    ("finished, copy gone", manager(conditions=[COMPLETE]), worker(), d.RemoveFinalizer,
     True),
    ("finished, copy and finalizer gone", manager(conditions=[COMPLETE], finalizer=False),
     worker(), d.Ignore, True),
    ("copy of an earlier job", manager(), worker(copy(uid="earlier")), d.DeleteRemote,
     False),
    ("same-named object of Kueue's", manager(), worker(copy(annotated=False)), d.Exclude,
     True),
    ("copy deleted by someone", manager(conditions=[CREATED]), worker(), d.Replace, True),
    ("deleted, copy there", manager(deleting=True), worker(copy()), d.DeleteRemote, True),
    ("deleted, copy gone", manager(deleting=True), worker(), d.RemoveFinalizer, True),
    ("deleted, worker down", manager(deleting=True), worker(active=False, down_for=10),
     d.Wait, False),
    ("deleted, worker lost", manager(deleting=True), worker(active=False, down_for=61),
     d.RemoveFinalizer, True),
    ("suspended, copy there", manager(suspend=True), worker(copy()), d.DeleteRemote, True),
    ("suspended, copy gone", manager(suspend=True), worker(), d.Unplace, True),
    ("worker down", manager(conditions=[CREATED]), worker(active=False, down_for=10),
     d.MarkUnreachable, False),
    ("worker down, said so",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerUnreachable")]),
     worker(active=False, down_for=10), d.Wait, False),
    ("worker lost", manager(conditions=[CREATED]), worker(active=False, down_for=61),
     d.Replace, True),
    ("worker down, job finished", manager(conditions=[COMPLETE]),
     worker(active=False, down_for=100), d.Ignore, False),
    ("worker back, copy silent",
     manager(conditions=[cond("WorkerReachable", "False", "WorkerUnreachable")]),
     worker(copy()), d.CopyStatus, False),
    ("worker left, copy there", manager(conditions=[CREATED]),
     worker(copy(conditions=[CREATED]), draining=True), d.MarkRemoved, True),
    ("worker left, said so, copy there",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved")]),
     worker(copy(conditions=[CREATED]), draining=True), d.DeleteRemote, True),
    ("worker left, copy confirmed gone",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved")]),
     worker(draining=True), d.Replace, True),
    ("worker left, unreachable", manager(conditions=[CREATED]),
     worker(draining=True, active=False), d.MarkRemoved, True),
    ("worker left, unreachable, waiting",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved", 10)]),
     worker(draining=True, active=False), d.Wait, True),
    ("worker left, unreachable past the timeout",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved", 61)]),
     worker(draining=True, active=False), d.Replace, True),
    ("worker unknown", manager(conditions=[CREATED]), worker(known=False, active=False),
     d.MarkRemoved, True),
    ("worker unknown past the timeout",
     manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved", 61)]),
     None, d.Replace, True),
    ("worker left, finished copy there", manager(conditions=[COMPLETE]),
     worker(copy(conditions=[COMPLETE]), draining=True), d.DeleteRemote, True),
    ("worker left, finished, copy gone", manager(conditions=[COMPLETE]),
     worker(draining=True), d.RemoveFinalizer, True),
]


@pytest.mark.parametrize("name,obj,state,expected,release", CASES, ids=[c[0] for c in CASES])
def test_transition(name, obj, state, expected, release):
    action = decide(obj, state)
    assert type(action) is expected, f"{name}: expected {expected.__name__}, got {action}"
    assert action.release is release, f"{name}: release expected {release}, got {action}"


def test_the_copied_status_is_the_copys_plus_placed_true_naming_the_worker():
    action = decide(manager(conditions=[cond("Placed", "False", "NoWorkerFits", 90)]),
                    worker(copy(conditions=[CREATED])))
    assert isinstance(action, d.CopyStatus)
    assert action.status["conditions"] == [{
        "type": "Placed", "status": "True", "reason": "Placed",
        "message": "placed on worker cluster w1", "lastTransitionTime": stamp(0)}, CREATED]
    # Copied again later: the same Placed=True (its time kept), so nothing to write.
    mirrored = manager(conditions=action.status["conditions"])
    assert isinstance(d.decide(mirrored, worker(copy(conditions=[CREATED])), NOW + 30,
                               SETTINGS), d.InSync)


def test_retention_waits_for_what_is_left_of_it():
    done_recently = cond(c.CONDITION_COMPLETE, seconds_ago=10)
    action = decide(manager(conditions=[PLACED, done_recently]),
                    worker(copy(conditions=[done_recently])))
    assert isinstance(action, d.Wait) and action.seconds == pytest.approx(20)


def test_a_failed_copy_is_kept_for_the_longer_of_its_two_retentions():
    settings = d.Settings(origin="multikueue", worker_lost_timeout=60, retention=30,
                          failed_retention=600)
    failed = cond(c.CONDITION_FAILED, seconds_ago=100)
    action = d.decide(manager(conditions=[PLACED, failed]), worker(copy(conditions=[failed])),
                      NOW, settings)
    assert isinstance(action, d.Wait) and action.seconds == pytest.approx(500), action
    # A completed one only for the retention of every finished copy.
    done = cond(c.CONDITION_COMPLETE, seconds_ago=100)
    action = d.decide(manager(conditions=[PLACED, done]), worker(copy(conditions=[done])),
                      NOW, settings)
    assert isinstance(action, d.DeleteRemote), action
    # Past it, a failed copy goes too; a longer retention of every copy keeps it longer.
    long_ago = cond(c.CONDITION_FAILED, seconds_ago=700)
    assert isinstance(d.decide(manager(conditions=[PLACED, long_ago]),
                               worker(copy(conditions=[long_ago])), NOW, settings),
                      d.DeleteRemote)
    longer = d.Settings(origin="multikueue", worker_lost_timeout=60, retention=1000,
                        failed_retention=600)
    assert isinstance(d.decide(manager(conditions=[PLACED, long_ago]),
                               worker(copy(conditions=[long_ago])), NOW, longer), d.Wait)


def test_the_unreachable_condition_names_the_worker_and_since_when():
    action = decide(manager(conditions=[CREATED]), worker(active=False, down_for=10))
    assert action.message.startswith(f"worker w1 unreachable since {stamp(10)}")
    assert action.wait == pytest.approx(50)


def test_a_restarted_dispatcher_goes_on_with_the_timeout_the_job_shows():
    """This process has seen the worker away for 5 s only (it has just started); the job
    says it has been unreachable for 70 s, longer than the 60 s timeout: it moves now."""
    away = cond(c.CONDITION_WORKER_REACHABLE, "False", c.REASON_WORKER_UNREACHABLE,
                seconds_ago=70)
    action = decide(manager(conditions=[CREATED, away]), worker(active=False, down_for=5))
    assert isinstance(action, d.Replace) and action.reason == c.REASON_WORKER_LOST, action
    assert "unreachable for 70s" in action.message, action.message
    # A job being deleted lets go of its unreachable copy after the same timeout.
    deleting = manager(conditions=[CREATED, away], deleting=True)
    assert not isinstance(decide(deleting, worker(active=False, down_for=5)), d.Wait)
    # Shown 20 s ago: 40 s are left, whatever this process saw.
    recent = {**away, "lastTransitionTime": stamp(20)}
    waiting = decide(manager(conditions=[CREATED, recent]), worker(active=False, down_for=5))
    assert isinstance(waiting, d.Wait) and waiting.seconds == pytest.approx(40), waiting


def test_a_copy_is_deleted_only_when_it_is_ours():
    # Kueue's copies carry the same origin label but not our manager-UID annotation.
    theirs = copy(annotated=False)
    for obj in (manager(deleting=True), manager(suspend=True)):
        action = decide(obj, worker(theirs))
        assert not isinstance(action, d.DeleteRemote), action


# --- crash points: after the first of two writes, the next step follows -----------------

def test_crash_after_placement_before_the_copy_is_created():
    # Placement and finalizer written; the create never happened.
    assert isinstance(decide(manager(), worker()), d.CreateRemote)


def test_crash_after_replace_wrote_status_before_placement_was_cleared():
    # Replace writes Placed=False then clears the placement. Crashed in between: the worker
    # is still lost, so the same Replace comes again (it is idempotent).
    half_done = manager(conditions=[cond("Placed", "False", "WorkerLost")])
    assert isinstance(decide(half_done, worker(active=False, down_for=61)), d.Replace)
    # ... and for a drained worker whose copy is gone, the same.
    assert isinstance(decide(half_done, worker(draining=True)), d.Replace)


def test_crash_after_the_copy_was_deleted_before_the_finalizer_went():
    assert isinstance(decide(manager(deleting=True), worker()), d.RemoveFinalizer)
    assert isinstance(decide(manager(suspend=True), worker()), d.Unplace)


def test_crash_after_marking_removed_before_deleting_the_copy():
    marked = manager(conditions=[CREATED, cond("WorkerReachable", "False", "WorkerRemoved")])
    assert isinstance(decide(marked, worker(copy(), draining=True)), d.DeleteRemote)


def test_crash_after_the_copy_was_created_before_its_status_came():
    # A restart finds the copy: nothing is created twice, nothing is written.
    assert isinstance(decide(manager(), worker(copy())), d.InSync)


def test_a_placed_job_is_never_placed_again_while_its_copy_may_run():
    """No state with a copy on a worker that may still run it leads to Place."""
    running = copy(conditions=[CREATED])
    states = [worker(running), worker(running, draining=True), worker(active=False),
              worker(active=False, draining=True), worker(known=False, active=False)]
    for state in states:
        action = decide(manager(conditions=[CREATED]), state)
        assert not isinstance(action, d.Place), (state, action)
