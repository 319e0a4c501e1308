"""The one writer of the room jobs hold on workers (pure: no API calls): the Placer's
reservations, and Kueue mode's holds for a Workload's job through the same object."""

from __future__ import annotations

from decimal import Decimal as D

from dispatcher.placement.need import Need
from dispatcher.placement.placer import Placer
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.room.worker_quota import CLUSTERQUEUES, LOCALQUEUES, WorkerQuota
from dispatcher.workers.cluster import WorkerCluster

from worker_fakes import Cache, Registry

WORKLOAD = ("ns", "job-j-1")
JOB = ("ns", "j")
NEED = Need({"cpu": D(6)}, 1, None, None, [{"cpu": D(6)}], ("ns", "q"))


def quota(name: str) -> WorkerQuota:
    """A worker Kueue whose LocalQueue ns/q leads to a ClusterQueue of 8 cpu."""
    worker_quota = WorkerQuota(name, None, lambda *_: None)
    worker_quota.served = True
    worker_quota.informers = {
        LOCALQUEUES: Cache({"metadata": {"name": "q", "namespace": "ns"},
                            "spec": {"clusterQueue": "cq"}}),
        CLUSTERQUEUES: Cache({"metadata": {"name": "cq"}, "spec": {"resourceGroups": [{
            "coveredResources": ["cpu"],
            "flavors": [{"name": "default",
                         "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}]}})}
    return worker_quota


def worker(name: str, order: int) -> WorkerCluster:
    capacity = WorkerCapacity(name)
    capacity.on_node("ADDED", None, {
        "metadata": {"name": f"{name}-node", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return WorkerCluster(name=name, order=order, fingerprint="", capacity=capacity,
                         quota=quota(name), active=True,
                         informers={"namespaces": Cache({"metadata": {"name": "ns"}})})


def quota_held(one: WorkerCluster) -> bool:
    """Whether a nomination's 6 cpu are counted on the worker's 8 cpu ClusterQueue."""
    return one.quota.verdict(("ns", "q"), {"cpu": D(6)}, 1, ("ns", "other")).problem is not None


def test_placing_reserves_capacity_and_quota_and_releasing_drops_both():
    one = worker("w1", 0)
    placer = Placer(Registry(one), "best-fit")
    chosen, _ = placer.place_need(JOB, NEED, {})
    assert chosen is one and one.capacity.reserved(JOB) and quota_held(one)
    assert placer.release(one, JOB)
    assert not one.capacity.reserved(JOB) and not quota_held(one)
    assert not placer.release(one, JOB)


def test_a_nominated_job_holds_quota_until_admitted_and_capacity_until_its_pods_come():
    one = worker("w1", 0)
    reservations = Placer(Registry(one), "best-fit").reservations
    assert not reservations.hold(WORKLOAD, "w1", JOB, NEED, admitted=False)
    assert one.capacity.reserved(JOB) and quota_held(one)
    # Admitted: the worker's Kueue counts its quota now; its Nodes' room stays held.
    assert not reservations.hold(WORKLOAD, "w1", JOB, NEED, admitted=True)
    assert one.capacity.reserved(JOB) and not quota_held(one)


def test_holding_on_another_worker_releases_the_first():
    one, two = worker("w1", 0), worker("w2", 1)
    reservations = Placer(Registry(one, two), "best-fit").reservations
    reservations.hold(WORKLOAD, "w1", JOB, NEED, admitted=False)
    assert reservations.hold(WORKLOAD, "w2", JOB, NEED, admitted=True)
    assert not one.capacity.reserved(JOB) and not quota_held(one)
    assert two.capacity.reserved(JOB)


def test_a_placement_recorded_for_a_workload_is_released_with_it():
    one = worker("w1", 0)
    placer = Placer(Registry(one), "best-fit")
    placer.place_need(JOB, NEED, {})
    placer.reservations.placed(WORKLOAD, "w1", JOB)
    assert placer.reservations.release_holder(WORKLOAD)
    assert not one.capacity.reserved(JOB) and not quota_held(one)
    assert not placer.reservations.release_holder(WORKLOAD)


def test_a_hold_released_behind_its_back_is_made_again():
    # A copy that finished or went releases the job's room (Placer.follow_copy); the next
    # reconcile of a Workload still admitted holds it again rather than trust its memo.
    one = worker("w1", 0)
    placer = Placer(Registry(one), "best-fit")
    placer.reservations.hold(WORKLOAD, "w1", JOB, NEED, admitted=True)
    placer.follow_copy("w1", JOB, "DELETED", None)
    assert not one.capacity.reserved(JOB)
    placer.reservations.hold(WORKLOAD, "w1", JOB, NEED, admitted=True)
    assert one.capacity.reserved(JOB)
