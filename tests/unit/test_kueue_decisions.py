"""Kueue mode's decision table (pure): what the nominator does for a manager Workload,
one test per row, and the states a crash between two writes leaves behind."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from controller_kit.api_time import format_time
from dispatcher.kueue import decisions as kd
from dispatcher.kueue import workloads as wl
from dispatcher.placement.need import Need

NOW = 1_000_000.0
CHECK = "multikueue-check"
CHECKS = {CHECK}
MANAGER = "trainjob-dispatcher"
SETTINGS = kd.Settings(admission_timeout=60, field_manager=MANAGER)
WORKERS = ("w1", "w2")
NEED = Need({"cpu": D(4)}, 2, None, None, [{"cpu": D(2)}] * 2, ("ns", "q"))
LEAST = Need({"cpu": D(2)}, 1, None, None, [{"cpu": D(2)}], ("ns", "q"))
SIZED = kd.Sizes(NEED)
UNSIZABLE = kd.Sizes("spec.podSets[0] (main): pod-level resources")
SKIP_W1 = {"w1": "nominated before and did not admit within 60s"}


def workload(*, quota=True, check="Pending", cluster=None, nominated=(), by=MANAGER,
             nominated_ago=10.0, tried=(), finished=False, deleting=False, evicted=False,
             sized_message=None):
    conditions = [{"type": "QuotaReserved", "status": "True" if quota else "False"}]
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True"})
    if sized_message is not None:
        conditions.append({"type": wl.SIZED_CONDITION, "status": "False",
                           "reason": wl.UNSIZABLE_REASON, "message": sized_message})
    status = {"conditions": conditions, "admissionChecks": [{"name": CHECK, "state": check}]}
    meta = {"name": "job-j-1", "namespace": "ns", "uid": "u", "generation": 1,
            "resourceVersion": "7", "annotations": {},
            "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}]}
    if cluster:
        status["clusterName"] = cluster
    if nominated:
        status["nominatedClusterNames"] = list(nominated)
        # When a field manager wrote the status is what its managed-fields entry says.
        meta["managedFields"] = [{"manager": by, "operation": "Update", "subresource": "status",
                                  "time": format_time(NOW - nominated_ago)}]
    if tried:
        meta["annotations"][wl.TRIED_ANNOTATION] = ",".join(tried)
    if deleting:
        meta["deletionTimestamp"] = format_time(NOW - 1)
    return {"metadata": meta, "spec": {"queueName": "q", "podSets": []}, "status": status}


def decide(obj, sized=SIZED, workers=WORKERS, idle=None, said=None):
    return kd.decide(obj, sized=sized, checks=CHECKS, workers=workers, now=NOW,
                     settings=SETTINGS, idle=idle, said=said)


def every_worker(workers, why=UNSIZABLE.whole, left_out=()):
    message = (f"cannot size the Workload, so no worker is chosen by room: {why}; "
               f"nominated every worker cluster ({', '.join(workers)}), as Kueue's "
               "all-at-once dispatcher would: the first whose Kueue admits it runs it")
    if left_out:
        message += f" (Kueue takes at most 20 names: {', '.join(left_out)} left out)"
    return message


def sized_condition(message):
    return {"type": wl.SIZED_CONDITION, "status": "False", "reason": wl.UNSIZABLE_REASON,
            "message": message, "lastTransitionTime": format_time(NOW),
            "observedGeneration": 1}


NO_WORKERS = ("cannot size the Workload: spec.podSets[0] (main): pod-level resources; no "
              "worker cluster is registered to nominate")
MANY = tuple(f"w{i:02d}" for i in range(22))
TIMED_OUT = "worker w1 did not admit the Workload within 60s; nominating the next"

# --- decide: one row per rule ------------------------------------------------------------

DECIDE = [
    # (name, workload, decide's other inputs, the action)
    ("kueue does not wait for us", workload(), {"idle": "Kueue nominates itself"},
     kd.Idle(why="Kueue nominates itself")),
    ("gone", None, {"sized": None}, kd.Forget(why="the Workload is gone")),
    ("finished", workload(cluster="w1", finished=True), {}, kd.Forget(why="finished")),
    ("being deleted", workload(deleting=True), {}, kd.Forget(why="being deleted")),
    ("admitted", workload(cluster="w2", check="Ready"), {},
     kd.Hold(worker="w2", need=NEED, admitted=True)),
    ("admitted, cannot be sized", workload(cluster="w2", check="Ready"),
     {"sized": UNSIZABLE},
     kd.Ignore(why="admitted on w2; cannot be sized, so no room to hold")),
    ("no quota reserved on the manager", workload(quota=False), {},
     kd.Release(why="not waiting for a worker: evicted, or its quota reservation went")),
    ("evicted", workload(evicted=True), {},
     kd.Release(why="not waiting for a worker: evicted, or its quota reservation went")),
    ("admission check not pending", workload(check="Retry"), {},
     kd.Release(why="not waiting for a worker: evicted, or its quota reservation went")),
    ("waiting", workload(), {}, kd.Choose(need=NEED)),
    ("waiting, partial admission allowed", workload(), {"sized": kd.Sizes(NEED, LEAST)},
     kd.Choose(need=NEED, least=LEAST)),
    ("waiting, least cannot be sized", workload(), {"sized": kd.Sizes(NEED, "no")},
     kd.Choose(need=NEED)),
    ("waiting, a worker tried before", workload(tried=["w1"]), {},
     kd.Choose(need=NEED, tried=("w1",), skip=SKIP_W1)),
    ("waiting, every worker tried", workload(tried=["w1", "w2"]), {},
     kd.Choose(need=NEED, tried=("w1", "w2"),
               skip={**SKIP_W1, "w2": "nominated before and did not admit within 60s"},
               every_worker_tried=True)),
    ("nominated by us, within the timeout", workload(nominated=["w1"], nominated_ago=10), {},
     kd.Hold(worker="w1", need=NEED, admitted=False, wait=50)),
    ("nominated by us, past the timeout", workload(nominated=["w1"], nominated_ago=61), {},
     kd.Choose(need=NEED, tried=("w1",), skip=SKIP_W1, timed_out=TIMED_OUT)),
    ("nominated by someone else", workload(nominated=["w1"], by="someone"), {},
     kd.Ignore(why="nominated by someone else: theirs to follow up")),
    ("cannot be sized", workload(), {"sized": UNSIZABLE},
     kd.NominateEveryWorker(names=WORKERS, added=WORKERS, message=every_worker(WORKERS),
                            condition=sized_condition(every_worker(WORKERS)))),
    ("cannot be sized, more workers than Kueue takes", workload(),
     {"sized": UNSIZABLE, "workers": MANY},
     kd.NominateEveryWorker(names=MANY[:20], added=MANY[:20],
                            message=every_worker(MANY[:20], left_out=MANY[20:]),
                            condition=sized_condition(every_worker(MANY[:20],
                                                                   left_out=MANY[20:])))),
    ("cannot be sized, every worker nominated already",
     workload(nominated=WORKERS, sized_message=every_worker(WORKERS)),
     {"sized": UNSIZABLE}, kd.Ignore(why="every worker nominated already")),
    ("cannot be sized, a worker registered since",
     workload(nominated=["w1"], sized_message=every_worker(["w1"])), {"sized": UNSIZABLE},
     kd.NominateEveryWorker(names=WORKERS, added=("w2",), message=every_worker(WORKERS),
                            condition=sized_condition(every_worker(WORKERS)))),
    ("cannot be sized, nominated by someone else", workload(nominated=["w1"], by="someone"),
     {"sized": UNSIZABLE}, kd.Ignore(why="nominated by someone else: theirs to follow up")),
    ("cannot be sized, no worker registered", workload(), {"sized": UNSIZABLE, "workers": ()},
     kd.SayPending(reason=wl.UNSIZABLE_REASON, message=NO_WORKERS,
                   shape=f"{wl.UNSIZABLE_REASON}: {kd.message_shape(NO_WORKERS)}")),
    ("cannot be sized, no worker registered, said already", workload(),
     {"sized": UNSIZABLE, "workers": (),
      "said": f"{wl.UNSIZABLE_REASON}: {kd.message_shape(NO_WORKERS)}"},
     kd.Ignore(why="waits for the reason said already")),
]


@pytest.mark.parametrize("name,obj,inputs,expected", DECIDE, ids=[row[0] for row in DECIDE])
def test_decide(name, obj, inputs, expected):
    assert decide(obj, **inputs) == expected


# --- nominate: one row per answer of the Placer ------------------------------------------

NO_ROOM = "w1: needs 4 cpu, 2 free; w2: needs 4 cpu, 1 free"
NO_ROOM_LEAST = "w1: needs 2 cpu, 1 free; w2: needs 2 cpu, 1 free"
BOTH_SHORT = f"{NO_ROOM}; nor with partial admission (1 of its 2 pods): {NO_ROOM_LEAST}"


def pending(message, reason=kd.NO_WORKER_FITS):
    return kd.SayPending(reason=reason, message=message,
                         shape=f"{reason}: {kd.message_shape(message)}")


NOMINATE = [
    # (name, the Choose, the Placer's answer for the whole need, for the least, said, action)
    ("a worker has room", kd.Choose(need=NEED), kd.Fits("w2"), None, None,
     kd.Nominate(worker="w2", message="nominated worker cluster w2", wait=60)),
    ("no worker has room", kd.Choose(need=NEED), NO_ROOM, None, None, pending(NO_ROOM)),
    ("no worker has room, said with other numbers", kd.Choose(need=NEED), NO_ROOM, None,
     pending(NO_ROOM.replace("2 free", "3 free")).shape,
     kd.Ignore(why="waits for the reason said already")),
    ("room for the least only", kd.Choose(need=NEED, least=LEAST), NO_ROOM, kd.Fits("w1"),
     None, kd.Nominate(worker="w1", message=(
         "nominated worker cluster w1 (room for 1 of its 2 pods only: the podSets' "
         "minCount, as Kueue's partial admission allows)"), wait=60)),
    ("no room for the least either", kd.Choose(need=NEED, least=LEAST), NO_ROOM,
     NO_ROOM_LEAST, None, pending(BOTH_SHORT)),
    ("no room, every worker tried", kd.Choose(need=NEED, tried=WORKERS,
                                              every_worker_tried=True),
     NO_ROOM, None, None, kd.StartOver()),
    ("room after a timeout", kd.Choose(need=NEED, tried=("w1",), skip=SKIP_W1,
                                       timed_out=TIMED_OUT),
     kd.Fits("w2"), None, None,
     kd.Nominate(worker="w2", message="nominated worker cluster w2", wait=60)),
]


@pytest.mark.parametrize("name,choose,whole,partial,said,expected", NOMINATE,
                         ids=[row[0] for row in NOMINATE])
def test_nominate(name, choose, whole, partial, said, expected):
    assert kd.nominate(choose, whole, partial, settings=SETTINGS, said=said) == expected


# --- which Workloads a change of room brings back ----------------------------------------

ANOTHER_LOOK = [
    ("waiting for a nomination", workload(), True),
    ("nominated by room", workload(nominated=["w1"]), False),
    ("nominated to every worker, unsized", workload(nominated=WORKERS,
                                                    sized_message=every_worker(WORKERS)),
     True),
    ("admitted", workload(cluster="w1", check="Ready"), False),
    ("no quota reserved", workload(quota=False), False),
]


@pytest.mark.parametrize("name,obj,expected", ANOTHER_LOOK, ids=[r[0] for r in ANOTHER_LOOK])
def test_needs_another_look(name, obj, expected):
    assert kd.needs_another_look(obj, CHECKS) is expected


# --- sizes ---------------------------------------------------------------------------------

def test_the_least_is_sized_only_when_kueue_may_admit_with_fewer_pods():
    asked = []

    def size(obj, at_min_count):
        asked.append(at_min_count)
        return LEAST if at_min_count else NEED

    assert kd.sizes(workload(), size) == kd.Sizes(NEED) and asked == [False]
    partial = workload()
    partial["spec"]["podSets"] = [{"name": "main", "count": 2, "minCount": 1}]
    assert kd.sizes(partial, size) == kd.Sizes(NEED, LEAST)


# --- crash points: after the first of two writes, the next step follows -------------------

def test_crash_after_recording_tried_before_the_next_nomination():
    # The timeout writes the tried annotation, then the next nomination. Crashed in
    # between: the same timeout comes again, w1 is not recorded twice and is skipped.
    half_done = workload(nominated=["w1"], nominated_ago=61, tried=["w1"])
    assert decide(half_done) == kd.Choose(need=NEED, tried=("w1",), skip=SKIP_W1,
                                          timed_out=TIMED_OUT)


def test_crash_after_the_nomination_before_its_room_was_held():
    # The nomination is in the Workload; room held only in memory is held again from it,
    # and the wait resumes where the managed-fields time says (a restart, too).
    assert decide(workload(nominated=["w2"], nominated_ago=1)) == kd.Hold(
        worker="w2", need=NEED, admitted=False, wait=59)


def test_crash_after_starting_over_before_the_next_nomination():
    # The tried list was cleared: every worker is a candidate again, none skipped.
    assert decide(workload()) == kd.Choose(need=NEED)


def test_crash_after_nominating_every_worker_before_the_event():
    # The nomination and the condition went in one write: nothing is written again.
    done = workload(nominated=WORKERS, sized_message=every_worker(WORKERS))
    assert decide(done, sized=UNSIZABLE) == kd.Ignore(why="every worker nominated already")
