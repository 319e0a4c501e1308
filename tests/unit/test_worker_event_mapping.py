"""The worker's reasons on the manager, decided (dispatcher/workers/worker_events.py):
which manager job a worker's Warning Event is about, by the copy's owner in each mode
(standalone/copy_owners.py: the dispatcher's copies; kueue/copy_owners.py: Kueue's, by
their Workload), and how its occurrences are counted into manager Events: one per
(worker, object, reason, message), raised on repeats, at most ``per_minute`` new ones per
job a minute and the rest counted in one Event."""

from __future__ import annotations

import pytest

from controller_kit.informer import Informer
from dispatcher.kueue.copy_owners import KueueCopies
from dispatcher.standalone.copy_owners import StandaloneCopies
from dispatcher.workers import projections
from dispatcher.workers import worker_events as we
from trainjob import constants as c

ORIGIN = c.DEFAULT_ORIGIN
NS = "team-a"
MANAGER_UID = "manager-uid-1"
COPY_UID = "copy-uid-1"


def copy(name: str = "train", *, manager_uid: str = MANAGER_UID, origin: str = ORIGIN,
         created: str = "2025-01-01T10:00:00Z", uid: str = COPY_UID) -> dict:
    annotations = {c.MANAGER_UID_ANNOTATION: manager_uid} if manager_uid else {}
    return {"metadata": {"name": name, "namespace": NS, "uid": uid,
                         "creationTimestamp": created,
                         "labels": {c.MULTIKUEUE_ORIGIN_LABEL: origin},
                         "annotations": annotations}}


def manager(name: str = "train", *, worker: str | None = "worker-1", uid: str = MANAGER_UID,
            managed_by: str = c.MANAGED_BY_MULTIKUEUE) -> dict:
    annotations = {c.PLACEMENT_ANNOTATION: worker} if worker else {}
    return {"metadata": {"name": name, "namespace": NS, "uid": uid,
                         "annotations": annotations},
            "spec": {"managedBy": managed_by}}


def event(kind: str, name: str, *, reason: str = "FailedScheduling", message: str = "0/3 nodes",
          event_name: str = "ev-1", count: int | None = None, series: int | None = None,
          created: str = "2025-01-01T10:00:05Z", uid: str | None = None) -> dict:
    obj = {"metadata": {"name": event_name, "namespace": NS, "creationTimestamp": created},
           "involvedObject": {"kind": kind, "name": name, "namespace": NS},
           "reason": reason, "message": message, "type": "Warning",
           "eventTime": "2025-01-01T10:00:05.123456Z"}
    if uid:
        obj["involvedObject"]["uid"] = uid
    if count is not None:
        obj["count"] = count
    if series is not None:
        obj["series"] = {"count": series, "lastObservedTime": "2025-01-01T10:01:00.000001Z"}
    return obj


def attribute(ev: dict, *, copies: dict | None = None, pods: dict | None = None,
              managers: dict | None = None, worker: str = "worker-1"):
    copies = {"train": copy()} if copies is None else copies
    managers = {"train": manager()} if managers is None else managers
    pods = pods or {}
    return we.attribute(ev, worker, lambda ns, n: copies.get(n), lambda ns, n: pods.get(n),
                        StandaloneCopies(ORIGIN, lambda ns, n: managers.get(n)))


JOB = we.JobRef(NS, "train", MANAGER_UID)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# --- which job ---------------------------------------------------------------------------


def test_occurrences_read_a_series_a_count_or_once():
    assert we.occurrences(event("Pod", "p")) == 1
    assert we.occurrences(event("Pod", "p", count=4)) == 4
    assert we.occurrences(event("Pod", "p", series=3)) == 3


def test_the_copy_and_its_jobset_by_name():
    assert attribute(event(c.TRAINJOB_KIND, "train", reason="BuildFailed")) == JOB
    assert attribute(event(c.JOBSET_KIND, "train")) == JOB


def test_a_pod_by_its_jobset_label_while_cached_else_by_its_name():
    assert attribute(event("Pod", "anything"), pods={"anything": "train"}) == JOB
    # Cached without the label: not a job's Pod, whatever its name says.
    assert attribute(event("Pod", "train-node-0-0-abcde"), pods={"train-node-0-0-abcde": ""}) \
        is None
    # Gone from the cache (finished Pods are not cached): its name, indexed or not.
    assert attribute(event("Pod", "train-node-0-0-abcde")) == JOB
    assert attribute(event("Pod", "train-dataset-initializer-0-x7k2p")) == JOB
    assert attribute(event("Pod", "train-node-0-0-toolong")) is None


def test_a_job_by_its_name_the_longest_copy_that_fits():
    copies = {"train": copy(), "train-node": copy("train-node", uid="other", manager_uid="m2")}
    managers = {"train": manager(), "train-node": manager("train-node", uid="m2")}
    assert attribute(event("Job", "train-node-0", reason="BackoffLimitExceeded"),
                     copies=copies, managers=managers) == we.JobRef(NS, "train", MANAGER_UID)
    assert attribute(event("Job", "train-node-launcher-0"), copies=copies,
                     managers=managers) == we.JobRef(NS, "train-node", "m2")
    assert attribute(event("Job", "train")) is None


def test_other_objects_are_ignored():
    assert attribute(event("Node", "train")) is None
    assert attribute(event("PersistentVolumeClaim", "train")) is None


def test_only_copies_of_this_dispatcher_of_this_manager_job_placed_there():
    ev = event(c.TRAINJOB_KIND, "train")
    assert attribute(ev, copies={}) is None  # no copy of that name
    assert attribute(ev, copies={"train": copy(manager_uid="")}) is None  # not ours
    assert attribute(ev, copies={"train": copy(origin="multikueue")}) is None  # Kueue's
    assert attribute(ev, copies={"train": copy(manager_uid="earlier")}) is None
    assert attribute(ev, managers={}) is None
    assert attribute(ev, managers={"train": manager(worker="worker-2")}) is None
    assert attribute(ev, managers={"train": manager(worker=None)}) is None
    assert attribute(ev, managers={"train": manager(managed_by="")}) is None
    assert attribute(ev, worker="worker-2") is None


def test_events_of_an_earlier_copy_are_not_this_ones():
    assert attribute(event(c.TRAINJOB_KIND, "train", uid="an-earlier-copy")) is None
    assert attribute(event(c.TRAINJOB_KIND, "train", uid=COPY_UID)) == JOB
    assert attribute(event("Pod", "train-node-0-0-abcde", created="2025-01-01T09:59:59Z")) \
        is None


def test_the_manager_message_names_the_worker_and_the_object():
    ev = event("Pod", "train-node-0-0-abcde", message="0/3 nodes are available: x" * 100)
    text = we.manager_message("worker-1", ev)
    assert text.startswith("worker-1: Pod train-node-0-0-abcde: 0/3 nodes are available: x")
    assert len(text) == we.MESSAGE_LIMIT


def test_the_projection_keeps_what_the_mirror_reads():
    full = event("Pod", "p", series=2)
    full["metadata"].update({"uid": "u", "resourceVersion": "7", "managedFields": [{}] * 3})
    full.update({"source": {"component": "default-scheduler"}, "related": {"kind": "Node"},
                 "reportingController": "x", "action": "Scheduling"})
    kept = projections.event(full)
    assert set(kept) == {"metadata", "involvedObject", "reason", "message", "type",
                         "eventTime", "series"}
    assert kept["metadata"] == {"name": "ev-1", "namespace": NS, "resourceVersion": "7",
                                "creationTimestamp": "2025-01-01T10:00:05Z"}
    assert we.attribute(kept, "worker-1", lambda ns, n: copy(), lambda ns, n: None,
                        StandaloneCopies(ORIGIN, lambda ns, n: manager())) is None  # no job's
    assert we.occurrences(kept) == 2


# --- Kueue mode: Kueue's copies, known by their Workload ----------------------------------

KUEUE_ORIGIN = c.KUEUE_DEFAULT_ORIGIN
WORKLOAD = "trainjob-train-3f2a1"


def kueue_copy(*, workload: str | None = WORKLOAD, origin: str = KUEUE_ORIGIN) -> dict:
    """Kueue's copy on a worker: its origin label and the Workload it names (no mark of
    the dispatcher's)."""
    obj = copy(manager_uid="", origin=origin)
    if workload:
        obj["metadata"]["annotations"][c.KUEUE_PREBUILT_WORKLOAD_LABEL] = workload
    return obj


def workload(*, owner_uid: str = MANAGER_UID, cluster: str | None = "worker-1",
             nominated: list[str] | None = None) -> dict:
    """The manager's Workload of the job: its owner, where it runs or was nominated."""
    status = {"clusterName": cluster} if cluster else {}
    if nominated is not None:
        status["nominatedClusterNames"] = nominated
    return {"metadata": {"name": WORKLOAD, "namespace": NS, "ownerReferences": [
        {"kind": c.TRAINJOB_KIND, "name": "train", "uid": owner_uid, "controller": True}]},
        "status": status}


class Cache(Informer):
    """The manager's Workload cache as the owners read it: listed, holding ``items``."""

    def __init__(self, *items: dict):
        super().__init__("manager/workloads", lambda: {"items": []})
        self.items = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}
        self.synced.set()

    def get(self, namespace: str, name: str) -> dict | None:
        return self.items.get((namespace, name))


def kueue_attribute(ev: dict, *, copies=None, workloads=None, managers=None,
                    worker: str = "worker-1", owners: KueueCopies | None = None):
    copies = {"train": kueue_copy()} if copies is None else copies
    managers = {"train": manager(worker=None)} if managers is None else managers
    cache = Cache(*([workload()] if workloads is None else workloads))
    owners = owners or KueueCopies(KUEUE_ORIGIN, lambda ns, n: managers.get(n), lambda: cache)
    return we.attribute(ev, worker, lambda ns, n: copies.get(n), lambda ns, n: None, owners)


def test_kueue_mode_a_kueue_copy_stands_for_the_job_its_workload_was_made_for():
    ev = event("Pod", "train-node-0-0-abcde")
    assert kueue_attribute(ev) == JOB
    assert kueue_attribute(event(c.TRAINJOB_KIND, "train")) == JOB
    # Before a worker admits it: the worker this dispatcher nominated.
    assert kueue_attribute(ev, workloads=[workload(cluster=None, nominated=["worker-1"])]) \
        == JOB
    # A label rather than an annotation (Kueue before v0.19).
    labelled = kueue_copy(workload=None)
    labelled["metadata"]["labels"][c.KUEUE_PREBUILT_WORKLOAD_LABEL] = WORKLOAD
    assert kueue_attribute(ev, copies={"train": labelled}) == JOB


def test_kueue_mode_not_a_copy_of_this_job_or_not_running_on_this_worker():
    ev = event("Pod", "train-node-0-0-abcde")
    assert kueue_attribute(ev, copies={"train": kueue_copy(workload=None)}) is None
    assert kueue_attribute(ev, copies={"train": kueue_copy(origin="other")}) is None
    assert kueue_attribute(ev, workloads=[]) is None  # no such Workload on the manager
    # The Workload of an earlier job of the same name.
    assert kueue_attribute(ev, workloads=[workload(owner_uid="earlier")]) is None
    # Admitted elsewhere (a copy left behind), or nominated elsewhere.
    assert kueue_attribute(ev, workloads=[workload(cluster="worker-2")]) is None
    assert kueue_attribute(ev, workloads=[workload(cluster=None, nominated=["worker-2"])]) \
        is None
    assert kueue_attribute(ev, managers={}) is None
    assert kueue_attribute(ev, managers={"train": manager(worker=None, managed_by="")}) is None


def test_kueue_mode_a_job_stays_placed_while_its_workload_runs_there():
    managers = {"train": manager(worker=None)}
    cache = Cache(workload())
    owners = KueueCopies(KUEUE_ORIGIN, lambda ns, n: managers.get(n), lambda: cache)
    assert kueue_attribute(event("Pod", "train-node-0-0-abcde"), owners=owners) == JOB
    assert owners.placed(JOB, "worker-1") and not owners.placed(JOB, "worker-2")
    cache.items[(NS, WORKLOAD)] = workload(cluster="worker-2")  # evicted, admitted elsewhere
    assert not owners.placed(JOB, "worker-1") and owners.placed(JOB, "worker-2")
    del cache.items[(NS, WORKLOAD)]  # the job's Workload gone
    assert not owners.placed(JOB, "worker-2")
    cache.items[(NS, WORKLOAD)] = workload()
    assert not owners.placed(JOB, "worker-1")  # forgotten with it
    assert not owners.placed(we.JobRef(NS, "train", "another-uid"), "worker-1")


# --- counting ----------------------------------------------------------------------------


def write_all(agg: we.Aggregation, existing=None) -> list[we.Write]:
    """Plan every due write, as the writer's passes do until nothing is due, and say each
    went through (new Events named manager-ev-0, manager-ev-1, ...)."""
    done: list[we.Write] = []
    while keys := agg.due():
        for key in keys:
            write = agg.plan(key, existing)
            if write is not None:
                agg.done(write, write.name or f"manager-ev-{len(done)}")
                done.append(write)
    return done


def test_repeats_raise_one_manager_events_count():
    agg = we.Aggregation(clock=Clock())
    assert agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    [first] = write_all(agg)
    assert (first.name, first.count, first.reason) == (None, 1, "FailedScheduling")
    assert first.message == "worker-1: Pod p: 0/3 nodes"
    # The same Event raised on the worker (core/v1 count, events.k8s.io series) ...
    assert agg.observe("worker-1", JOB, event("Pod", "p", event_name="a", series=2))
    # ... and another worker Event of the same reason, object and message.
    assert agg.observe("worker-1", JOB, event("Pod", "p", event_name="b", count=3))
    [raised] = write_all(agg)
    assert (raised.name, raised.count, raised.new) == ("manager-ev-0", 5, 4)
    assert raised.last == "2025-01-01T10:01:00Z" and raised.first == "2025-01-01T10:00:05Z"
    # A relist delivering what was seen adds nothing, and no write is due.
    assert not agg.observe("worker-1", JOB, event("Pod", "p", event_name="b", count=3))
    assert write_all(agg) == []
    assert len(agg.groups()) == 1


def test_another_message_or_object_is_another_manager_event():
    agg = we.Aggregation(clock=Clock())
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="b", message="0/4 nodes"))
    agg.observe("worker-1", JOB, event("Pod", "q", event_name="c"))
    assert sorted(w.message for w in write_all(agg)) == [
        "worker-1: Pod p: 0/3 nodes", "worker-1: Pod p: 0/4 nodes", "worker-1: Pod q: 0/3 nodes"]


def test_over_the_limit_the_rest_are_counted_in_one_event():
    clock = Clock()
    agg = we.Aggregation(per_minute=3, clock=clock)
    for i in range(5):
        agg.observe("worker-1", JOB, event("Pod", f"p{i}", event_name=f"e{i}", count=2))
    writes = write_all(agg)
    shown = [w for w in writes if not w.limited]
    assert len(shown) == 3
    [limited] = [w for w in writes if w.limited]
    assert limited.reason == we.REASON_LIMITED and limited.count == 4  # 2 Pods x 2
    assert limited.message.startswith("worker-1: more than 3 distinct Warning Events a minute")
    # Repeats of a shown one still raise it; of a limited one, the limited Event.
    agg.observe("worker-1", JOB, event("Pod", "p0", event_name="e0", count=3))
    agg.observe("worker-1", JOB, event("Pod", "p4", event_name="e4", count=5))
    raised = {w.message.split(":")[1].strip(): w.count for w in write_all(agg)}
    assert raised == {"Pod p0": 3, "more than 3 distinct Warning Events a minute about this "
                      "job's objects; the occurrences of the rest are counted here, not shown "
                      "(`kubectl get events -n team-a` on worker-1 lists them)": 7}
    # A minute on, new ones are shown again.
    clock.now += we.WINDOW_SECONDS + 1
    agg.observe("worker-1", JOB, event("Pod", "p9", event_name="e9"))
    assert [w.message for w in write_all(agg)] == ["worker-1: Pod p9: 0/3 nodes"]


def test_the_limit_is_per_job():
    agg = we.Aggregation(per_minute=1, clock=Clock())
    other = we.JobRef(NS, "other", "uid-2")
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    agg.observe("worker-1", other, event("Pod", "q", event_name="b"))
    assert [w.limited for w in write_all(agg)] == [False, False]


def test_an_existing_manager_event_is_raised_not_written_again():
    """After a restart, or on the replica that takes over: the Event the job has already."""
    agg = we.Aggregation(per_minute=1, clock=Clock())
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a", count=4))
    [key] = agg.due()
    assert agg.unwritten(key) == JOB
    existing = {("FailedScheduling", "worker-1: Pod p: 0/3 nodes"): ("earlier", 4)}
    assert agg.plan(key, existing) is None  # as written: nothing to do
    assert agg.unwritten(key) is None
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a", count=5))
    [write] = write_all(agg)
    assert (write.name, write.count) == ("earlier", 5)
    # Taking one over uses none of the job's new Events.
    agg.observe("worker-1", JOB, event("Pod", "q", event_name="b"))
    assert [w.limited for w in write_all(agg)] == [False]


def test_an_expired_manager_event_is_made_again_whole():
    agg = we.Aggregation(clock=Clock())
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a", count=2))
    write_all(agg)
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a", count=3))
    [key] = agg.due()
    patch = agg.plan(key)
    assert patch.name == "manager-ev-0"
    agg.lost(patch)
    [again] = write_all(agg)
    assert (again.name, again.count) == (None, 3)


def test_a_failed_write_is_due_again_and_a_refused_one_is_not():
    agg = we.Aggregation(clock=Clock())
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    [key] = agg.due()
    agg.plan(key)
    agg.retry(key)
    assert agg.due() == [key]
    write = agg.plan(key)
    agg.drop(write)
    agg.retry(key)
    assert [agg.plan(k) for k in agg.due()] == [None]


def test_prune_forgets_jobs_no_longer_placed_and_idle_events():
    clock = Clock()
    agg = we.Aggregation(clock=clock)
    other = we.JobRef(NS, "other", "uid-2")
    agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    agg.observe("worker-1", other, event("Pod", "q", event_name="b"))
    assert agg.prune(lambda job, worker: job == JOB) == {MANAGER_UID}
    assert [g.job for g in agg.groups()] == [JOB]
    clock.now += we.IDLE_SECONDS + 1
    assert agg.prune(lambda job, worker: True) == set()
    # What was seen of the worker's Event is kept longer: a relist counts it no more.
    assert not agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))
    agg.forget("worker-1", event("Pod", "p", event_name="a"))
    assert agg.observe("worker-1", JOB, event("Pod", "p", event_name="a"))


def test_on_by_default_off_by_flag_or_key(tmp_path):
    from dispatcher.cli import build_parser, config_from_args
    from dispatcher.config import load_config

    parser = build_parser()
    assert config_from_args(parser.parse_args(["run"])).mirror_worker_events
    assert not config_from_args(
        parser.parse_args(["run", "--no-mirror-worker-events"])).mirror_worker_events
    path = tmp_path / "config.yaml"
    path.write_text("mirror_worker_events: false\n")
    assert not load_config(path).mirror_worker_events


def test_the_watched_namespaces_and_their_own_rate_by_flag_or_key(tmp_path):
    from dispatcher.cli import build_parser, config_from_args
    from dispatcher.config import ConfigError, load_config

    parser = build_parser()
    default = config_from_args(parser.parse_args(["run"]))
    assert (default.worker_event_watches, default.worker_event_list_seconds,
            default.worker_event_qps, default.worker_event_burst) == (20, 30.0, 10.0, None)
    given = config_from_args(parser.parse_args([
        "run", "--worker-event-watches", "2", "--worker-event-list-interval", "5",
        "--worker-event-qps", "3"]))
    assert (given.worker_event_watches, given.worker_event_list_seconds,
            given.worker_event_qps) == (2, 5.0, 3.0)
    path = tmp_path / "config.yaml"
    path.write_text("worker_event_watches: 0\nworker_event_burst: 7\n")
    loaded = load_config(path)
    assert (loaded.worker_event_watches, loaded.worker_event_burst) == (0, 7)
    with pytest.raises(ConfigError, match="--worker-event-list-interval: Input should be "
                       "greater than 0"):
        config_from_args(parser.parse_args(["run", "--worker-event-list-interval", "0"]))
