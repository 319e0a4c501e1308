"""A worker Kueue's ClusterQueue quota as room (kueue mode): the arithmetic, the queue a
Workload is admitted through, and the Placer treating a worker as fitting only when both
its Nodes and its quota have room (pure: no API calls)."""

from __future__ import annotations

from decimal import Decimal as D

from dispatcher.kueue import workloads as wl
from dispatcher.placement.need import Need
from dispatcher.placement.placer import Placer
from dispatcher.room import kueue_quota as kq
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.room.worker_quota import CLUSTERQUEUES, LOCALQUEUES, WorkerQuota
from dispatcher.workers.cluster import WorkerCluster

from worker_fakes import Cache, Registry

WHERE = "ClusterQueue cq (LocalQueue ns/q)"


def cluster_queue(name="cq", quota=None, reserved=None, usage=None, cohort=None,
                  borrowing=None, flavors=None):
    """A ClusterQueue with one resource group; ``flavors`` ([(name, quota)]) overrides the
    single default flavor."""
    flavors = flavors or [("default", quota or {"cpu": "8", "memory": "64Gi"})]
    covered = sorted({r for _, q in flavors for r in q})
    spec = {"resourceGroups": [{"coveredResources": covered, "flavors": [
        {"name": f, "resources": [{"name": r, "nominalQuota": v,
                                   **({"borrowingLimit": borrowing[r]}
                                      if borrowing and r in borrowing else {})}
                                  for r, v in q.items()]} for f, q in flavors]}]}
    if cohort:
        spec["cohortName"] = cohort
    status = {}
    for field_name, by_flavor in (("flavorsReservation", reserved), ("flavorsUsage", usage)):
        if by_flavor is not None:
            status[field_name] = [{"name": f, "resources": [
                {"name": r, "total": v} for r, v in amounts.items()]}
                for f, amounts in by_flavor.items()]
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def fit(obj, pods=0, **asked):
    room = kq.quota_room(obj)
    return kq.fit(room, kq.wanted(room, {r: D(v) for r, v in asked.items()}, pods), WHERE)


# --- arithmetic ---------------------------------------------------------------------------

def test_room_is_nominal_quota_minus_what_is_reserved():
    obj = cluster_queue(quota={"cpu": "8"}, reserved={"default": {"cpu": "6"}})
    assert fit(obj, cpu="2").problem is None
    assert fit(obj, cpu="2").free == {"cpu": D(2)}
    assert fit(obj, cpu="3").problem == (
        "ClusterQueue cq (LocalQueue ns/q) has too little quota: 3 cpu requested, 2 free "
        "(nominalQuota 8, reserved 6)")


def test_reservations_include_workloads_not_yet_admitted():
    # flavorsReservation (quota reserved, admitted or not) is what admission is checked
    # against; flavorsUsage (admitted only) is the fallback for a status without it.
    both = cluster_queue(quota={"cpu": "8"}, reserved={"default": {"cpu": "6"}},
                         usage={"default": {"cpu": "2"}})
    assert fit(both, cpu="4").problem is not None
    only_usage = cluster_queue(quota={"cpu": "8"}, usage={"default": {"cpu": "2"}})
    assert fit(only_usage, cpu="6").problem is None
    assert fit(only_usage, cpu="7").problem is not None


def test_every_short_resource_is_named_in_people_units():
    obj = cluster_queue(quota={"cpu": "4", "memory": "8Gi"})
    assert fit(obj, cpu="6", memory=str(16 * 2**30)).problem == (
        f"{WHERE} has too little quota: 6 cpu requested, 4 free (nominalQuota 4, reserved 0), "
        "16Gi memory requested, 8Gi free (nominalQuota 8Gi, reserved 0)")


def test_a_resource_the_cluster_queue_does_not_cover_cannot_be_admitted():
    obj = cluster_queue(quota={"cpu": "64"})
    assert fit(obj, cpu="1", **{"nvidia.com/gpu": "1"}).problem == (
        f"{WHERE} has no quota for nvidia.com/gpu (not in any "
        "spec.resourceGroups[].coveredResources)")


def test_pods_count_only_where_the_cluster_queue_covers_them():
    assert fit(cluster_queue(quota={"cpu": "8"}), pods=50, cpu="1").problem is None
    covered = cluster_queue(quota={"cpu": "8", "pods": "2"})
    assert "3 pods requested, 2 free" in fit(covered, pods=3, cpu="1").problem


def test_flavors_are_tried_in_order_and_one_with_room_is_enough():
    obj = cluster_queue(flavors=[("small", {"cpu": "2"}), ("big", {"cpu": "16"})],
                        reserved={"big": {"cpu": "4"}})
    verdict = fit(obj, cpu="8")
    assert verdict.problem is None and verdict.free == {"cpu": D(12)}
    assert fit(obj, cpu="13").problem == (
        f"{WHERE} has too little quota: flavor small: 13 cpu requested, 2 free (nominalQuota "
        "2, reserved 0), flavor big: 13 cpu requested, 12 free (nominalQuota 16, reserved 4)")


def test_borrowing_counts_up_to_its_limit_and_without_one_the_quota_does_not_limit():
    limited = cluster_queue(quota={"cpu": "4"}, cohort="team", borrowing={"cpu": "4"},
                            reserved={"default": {"cpu": "2"}})
    assert fit(limited, cpu="6").problem is None
    assert fit(limited, cpu="7").problem == (
        f"{WHERE} has too little quota: 7 cpu requested, 6 free (nominalQuota 4, "
        "borrowingLimit 4, reserved 2)")
    unlimited = cluster_queue(quota={"cpu": "4"}, cohort="team")
    assert fit(unlimited, cpu="400").problem is None
    # Outside a cohort nothing is borrowed, whatever the spec says.
    assert fit(cluster_queue(quota={"cpu": "4"}), cpu="5").problem is not None


def test_pending_nominations_take_room_on_the_first_flavor_with_room():
    room = kq.quota_room(cluster_queue(flavors=[("a", {"cpu": "4"}), ("b", {"cpu": "8"})]))
    kq.take(room, {"cpu": D(4)})   # fills a
    kq.take(room, {"cpu": D(6)})   # does not fit a any more: b
    verdict = kq.fit(room, {"cpu": D(3)}, WHERE)
    assert verdict.problem == (
        f"{WHERE} has too little quota: flavor a: 3 cpu requested, 0 free (nominalQuota 4, "
        "reserved 0, nominated here and not reserved yet 4), flavor b: 3 cpu requested, 2 "
        "free (nominalQuota 8, reserved 0, nominated here and not reserved yet 6)")


def test_a_workload_names_its_queue():
    workload = {"metadata": {"name": "w", "namespace": "ns"},
                "spec": {"queueName": "q", "podSets": [{"name": "node", "count": 2, "template": {
                    "spec": {"containers": [{"name": "c", "resources": {
                        "requests": {"cpu": "3"}}}]}}}]}}
    need = wl.podset_need(workload)
    assert need.queue == ("ns", "q") and need.requests == {"cpu": D(6)} and need.pods == 2
    del workload["spec"]["queueName"]
    assert wl.podset_need(workload).queue is None


# --- one worker's queues --------------------------------------------------------------------

def local_queue(name="q", namespace="ns", cq="cq"):
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cq}}


def quota(*objs, served=True, synced=True, error=None):
    worker_quota = WorkerQuota("worker-x", None, lambda *_: None)
    worker_quota.served = served
    if served:
        worker_quota.informers = {
            CLUSTERQUEUES: Cache(*[o for o in objs if "resourceGroups" in o.get("spec", {})],
                                 synced=synced, error=error),
            LOCALQUEUES: Cache(*[o for o in objs if "clusterQueue" in o.get("spec", {})],
                               synced=synced, error=error)}
    return worker_quota


def test_a_worker_without_the_local_queue_is_not_a_candidate():
    verdict = quota(cluster_queue()).verdict(("ns", "q"), {"cpu": D(1)}, 1, ("ns", "j"))
    assert verdict.problem == ("LocalQueue ns/q (the Workload's spec.queueName) not found: "
                               "this worker's Kueue would not admit it")
    verdict = quota(local_queue(cq="gone")).verdict(("ns", "q"), {"cpu": D(1)}, 1, ("ns", "j"))
    assert verdict.problem == ("ClusterQueue gone (LocalQueue ns/q spec.clusterQueue) not "
                               "found: this worker's Kueue would not admit it")


def test_without_kueue_or_with_unreadable_queues_the_quota_is_not_used():
    assert quota(served=False).verdict(("ns", "q"), {"cpu": D(1)}, 1, ("ns", "j")) is None
    assert quota(served=False).unreadable() == (
        "Kueue's API (kueue.x-k8s.io/v1beta2 clusterqueues, localqueues) is not served")
    refused = quota(synced=False, error="403 Forbidden")
    assert refused.verdict(("ns", "q"), {"cpu": D(1)}, 1, ("ns", "j")) is None
    assert "cannot be read" in refused.unreadable() and "403 Forbidden" in refused.unreadable()
    # Served and still on its first list: not a candidate until the quota is seen.
    assert quota(synced=False).verdict(("ns", "q"), {"cpu": D(1)}, 1, ("ns", "j")).problem == \
        "Kueue's queues on worker-x not read yet"


def test_nominations_hold_quota_until_released_and_a_job_never_counts_against_itself():
    worker_quota = quota(local_queue(), local_queue(name="other"),
                         cluster_queue(quota={"cpu": "8"}))
    worker_quota.hold(("ns", "a"), ("ns", "q"), {"cpu": D(6)}, 1)
    assert worker_quota.verdict(("ns", "q"), {"cpu": D(6)}, 1, ("ns", "a")).problem is None
    short = worker_quota.verdict(("ns", "other"), {"cpu": D(6)}, 1, ("ns", "b")).problem
    assert short == ("ClusterQueue cq (LocalQueue ns/other) has too little quota: 6 cpu "
                     "requested, 2 free (nominalQuota 8, reserved 0, nominated here and not "
                     "reserved yet 6)")
    assert worker_quota.release(("ns", "a"))
    assert worker_quota.verdict(("ns", "q"), {"cpu": D(6)}, 1, ("ns", "b")).problem is None


# --- the Placer: Node room and quota room ----------------------------------------------------

def worker(name, order, node_cpu, worker_quota):
    capacity = WorkerCapacity(name)
    capacity.on_node("ADDED", None, {
        "metadata": {"name": f"{name}-node", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": str(node_cpu), "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return WorkerCluster(name=name, order=order, fingerprint="", capacity=capacity,
                         quota=worker_quota, active=True,
                         informers={"namespaces": Cache({"metadata": {"name": "ns"}})})


def need(cpu):
    return Need({"cpu": D(cpu)}, 1, None, None, [{"cpu": D(cpu)}], ("ns", "q"))


def test_a_job_that_fits_the_nodes_but_not_the_quota_goes_to_the_other_worker():
    tight = worker("worker-1", 0, 8, quota(local_queue(), cluster_queue(quota={"cpu": "4"})))
    roomy = worker("worker-2", 1, 16, quota(local_queue(), cluster_queue(quota={"cpu": "32"})))
    placer = Placer(Registry(tight, roomy), "best-fit")
    # Node room alone would choose worker-1 (the tighter fit for 6 cpu).
    chosen, _ = placer.place_need(("ns", "j"), need(6), {})
    assert chosen.name == "worker-2"
    assert roomy.quota.verdict(("ns", "q"), {"cpu": D(27)}, 1, ("ns", "k")).problem is not None
    # Neither fits: each reason names the quota or the Nodes that lack room.
    refused = placer.place_need(("ns", "big"), need(12), {})
    assert refused == (
        "worker-1: ClusterQueue cq (LocalQueue ns/q) has too little quota: 12 cpu requested, "
        "4 free (nominalQuota 4, reserved 0) (and its Nodes: needs 12 cpu, 8 free); "
        "worker-2: needs 12 cpu, 10 free")


def test_a_worker_without_kueue_is_placed_by_its_nodes_alone():
    plain = worker("worker-1", 0, 8, quota(served=False))
    placer = Placer(Registry(plain), "best-fit")
    chosen, _ = placer.place_need(("ns", "j"), need(6), {})
    assert chosen.name == "worker-1"
    missing_queue = worker("worker-1", 0, 8, quota(cluster_queue()))
    assert Placer(Registry(missing_queue), "best-fit").place_need(("ns", "j"), need(1), {}) == (
        "worker-1: LocalQueue ns/q (the Workload's spec.queueName) not found: this worker's "
        "Kueue would not admit it")


def test_a_job_waits_while_a_worker_with_room_is_still_reading_its_queues():
    # worker-1 is the tighter fit, but its queues' first list has not ended: choosing
    # worker-2 now would be a choice made blind. The job waits, and goes to worker-1 once
    # its queues are read.
    unread = quota(local_queue(), cluster_queue(quota={"cpu": "32"}), synced=False)
    tight = worker("worker-1", 0, 8, unread)
    roomy = worker("worker-2", 1, 16, quota(local_queue(), cluster_queue(quota={"cpu": "32"})))
    placer = Placer(Registry(tight, roomy), "best-fit")
    assert placer.place_need(("ns", "j"), need(6), {}) == (
        "worker-1: Kueue's queues on worker-x not read yet")
    for informer in unread.informers.values():
        informer.synced.set()
    chosen, _ = placer.place_need(("ns", "j"), need(6), {})
    assert chosen.name == "worker-1"
    # Queues that cannot be read are not waited for: Node room alone decides there.
    broken = worker("worker-1", 0, 8, quota(local_queue(), synced=False, error="403 Forbidden"))
    chosen, _ = Placer(Registry(broken, roomy), "best-fit").place_need(("ns", "k"), need(6), {})
    assert chosen.name == "worker-1"
