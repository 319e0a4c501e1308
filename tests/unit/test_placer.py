"""The Placer (pure): a job's need worked out once per job content and runtime content,
and reservations that follow the copies this dispatcher made."""

from __future__ import annotations

import threading
from decimal import Decimal as D

import pytest

from clusters.testing import eventually
from dispatcher.placement import placer as placer_module
from dispatcher.placement.placer import Placer
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

from worker_fakes import Cache, Registry


def runtime(uid: str, version: str, cpu: str) -> dict:
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
            "metadata": {"name": "plain", "uid": uid, "resourceVersion": version},
            "spec": {"template": {"spec": {"replicatedJobs": [{
                "name": c.NODE,
                "template": {"metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                             "spec": {"template": {"spec": {"containers": [{
                                 "name": c.NODE, "image": "trainer",
                                 "resources": {"requests": {"cpu": cpu}}}]}}}}}]}}}}


def worker(name: str, order: int, training_runtime: dict) -> WorkerCluster:
    capacity = WorkerCapacity(name)
    capacity.on_node("ADDED", None, {
        "metadata": {"name": f"{name}-node", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return WorkerCluster(name=name, order=order, fingerprint="", capacity=capacity, active=True,
                         informers={"namespaces": Cache({"metadata": {"name": "ns"}}),
                                    c.CLUSTERTRAININGRUNTIMES: Cache(training_runtime)})


def job(name: str, uid: str | None = "uid-1", version: str | None = "10", nodes: int = 2,
        annotations: dict | None = None) -> dict:
    return {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version,
                     "annotations": annotations or {}},
        "spec": {"runtimeRef": {"name": "plain"}, "trainer": {"numNodes": nodes}}}


@pytest.fixture
def builds(monkeypatch):
    """How many times a runtime was worked out for a job."""
    calls = []
    real = placer_module.build_runtime_info

    def counted(*args, **kwargs):
        calls.append(args[0].metadata.name)
        return real(*args, **kwargs)

    monkeypatch.setattr(placer_module, "build_runtime_info", counted)
    return calls


def test_workers_holding_the_same_runtime_share_one_build(builds):
    # Same content, different uid and version on each worker (each is its own apiserver).
    placer = Placer(Registry(worker("worker-1", 0, runtime("u1", "5", "2")),
                             worker("worker-2", 1, runtime("u2", "7", "2"))), "best-fit")
    chosen, need = placer.place(job("a"))
    assert need.requests["cpu"] == D(4) and need.pods == 2
    assert builds == ["a"]
    # Placing the same version again (a retry) builds nothing.
    placer.release(chosen, ("ns", "a"))
    placer.place(job("a"))
    assert builds == ["a"]


def test_a_changed_runtime_or_job_is_worked_out_again(builds):
    one = worker("worker-1", 0, runtime("u1", "5", "2"))
    two = worker("worker-2", 1, runtime("u2", "7", "2"))
    placer = Placer(Registry(one, two), "best-fit")
    placer.place(job("a"))
    two.informers[c.CLUSTERTRAININGRUNTIMES] = Cache(runtime("u2", "8", "16"))
    assert placer.need_on(job("a"), two)[1].requests["cpu"] == D(32)
    assert placer.need_on(job("a"), one)[1].requests["cpu"] == D(4)
    assert builds == ["a", "a"]
    # A new version with a changed spec is worked out again; one that changed nothing
    # the need depends on (the placement annotation, say) is not.
    assert placer.need_on(job("a", version="11", nodes=3), one)[1].pods == 3
    assert builds == ["a", "a", "a"]
    placer.need_on(job("a", version="12", nodes=3,
                       annotations={c.PLACEMENT_ANNOTATION: "worker-1"}), one)
    assert builds == ["a", "a", "a"]


def test_jobs_made_from_one_template_share_a_build_and_different_ones_never_do(builds):
    one = worker("worker-1", 0, runtime("u1", "5", "2"))
    placer = Placer(Registry(one), "best-fit")
    assert placer.need_on(job("a", uid="u-a"), one)[1].pods == 2
    assert placer.need_on(job("b", uid="u-b", version="3"), one)[1].pods == 2
    assert builds == ["a"], "the same spec in another job needs no second build"
    assert placer.need_on(job("c", uid=None, version=None, nodes=4), one)[1].pods == 4
    assert placer.need_on(job("d", uid="u-d", annotations={"team": "x"}), one)[1].pods == 2
    assert builds == ["a", "c", "d"]


def test_a_copy_this_dispatcher_did_not_make_leaves_the_reservation_alone():
    """In kueue mode Kueue makes the copy of a job this dispatcher nominated: its
    appearing must not free the room the nomination holds; its end does."""
    one = worker("worker-1", 0, runtime("u1", "5", "2"))
    placer = Placer(Registry(one), "best-fit")
    placer.place(job("a"))
    kueues_copy = {"metadata": {"name": "a", "namespace": "ns"}, "spec": {}}
    assert placer.follow_copy("worker-1", ("ns", "a"), "ADDED", kueues_copy) is False
    assert one.capacity.reserved(("ns", "a"))
    assert placer.follow_copy("worker-1", ("ns", "a"), "DELETED", kueues_copy) is True
    assert not one.capacity.reserved(("ns", "a"))


def test_a_placement_on_one_worker_does_not_wait_for_a_decision_held_on_another():
    """Worker b's decision is held (a long packing, here stopped in its read of b's room):
    a job that reads only a's room is placed meanwhile; a job that reads both waits for
    b's decision and then sees its reservation (b has room for one such job, and the
    waiting one would fit b best were that reservation not counted)."""
    small = worker("worker-b", 1, runtime("u2", "5", "20"))  # 64 cpu: one job of 2 x 20
    large = worker("worker-a", 0, runtime("u1", "5", "20"))
    large.capacity.on_node("ADDED", None, {
        "metadata": {"name": "worker-a-node-2", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": "64", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})  # 128 cpu in all
    placer = Placer(Registry(large, small), "best-fit")
    reading_b, let_go = threading.Event(), threading.Event()
    read_b = small.capacity.free

    def held_free(*args, **kwargs):
        if threading.current_thread().name == "held-on-b":
            reading_b.set()
            assert let_go.wait(30), "the test never let b's decision go"
        return read_b(*args, **kwargs)

    small.capacity.free = held_free
    results: dict[str, object] = {}

    def place(name: str, skip: dict[str, str]) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: results.__setitem__(name, placer.place(job(name), skip)),
            name="held-on-b" if name == "on-b" else name, daemon=True)
        thread.start()
        return thread

    on_b = place("on-b", {"worker-a": "not this one"})
    try:
        assert reading_b.wait(10), "the placement on worker-b never read b's room"
        on_a = place("on-a", {"worker-b": "not this one"})
        on_a.join(10)
        assert not on_a.is_alive(), \
            "a placement that reads only worker-a's room waited for worker-b's decision"
        assert results["on-a"][0].name == "worker-a"
        # Reads both: it takes a's ledger, then waits for b's (or, were b's not held, it
        # would finish here and choose b, where the held decision's job goes too).
        either = place("either", {})
        ledgers = placer.reservations._ledgers
        seen = eventually(lambda: ("either" in results,
                                   "worker-a" in ledgers and ledgers["worker-a"].locked()), any,
                          expected="the placement reading both workers to finish or to "
                                   "hold worker-a's ledger", timeout=10)
        assert seen == (False, True), \
            f"a placement reading worker-b's room finished while b's decision was held " \
            f"(placed on {results['either'][0].name})"
    finally:
        let_go.set()
    on_b.join(10)
    either.join(10)
    assert not on_b.is_alive() and not either.is_alive(), "a placement never finished"
    assert (results["on-b"][0].name, results["either"][0].name) == ("worker-b", "worker-a")
    # 128 - 40 - 40 on a; 64 - 40 on b: nothing counted twice.
    assert (large.capacity.free()["cpu"], read_b()["cpu"]) == (48, 24)


def test_the_placer_chooses_with_the_chooser_and_names_what_keeps_nodes_out():
    one = worker("worker-1", 0, runtime("u1", "5", "48"))  # 2 pods of 48 cpu: 96 on 64
    one.capacity.on_node("ADDED", None, {
        "metadata": {"name": "gpu-node", "labels": {}},
        "spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "64", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    two = worker("worker-2", 1, runtime("u2", "5", "2"))
    gone = worker("worker-3", 2, runtime("u3", "5", "2"))
    gone.active = False
    placer = Placer(Registry(one, two, gone), "best-fit")
    chosen, need = placer.place(job("a"))
    assert (chosen.name, need.requests) == ("worker-2", {"cpu": D(4)})
    placer.release(chosen, ("ns", "a"))
    two.active = False
    assert placer.place(job("a")) == (
        "worker-1: needs 96 cpu, 64 free (Nodes excluded: 1 with taint gpu=true:NoSchedule "
        "(not tolerated)); worker-2: not connected (ClientConnectionFailed: not probed yet); "
        "worker-3: not connected (ClientConnectionFailed: not probed yet)")
    assert Placer(Registry(), "best-fit").place(job("a")) == "no worker cluster is registered"
