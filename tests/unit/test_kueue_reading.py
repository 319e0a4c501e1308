"""Reading Kueue's objects (pure): which TrainJobs Kueue manages, when a Workload waits for
a nomination, and what its podSets ask of a worker; the decision to leave a job to Kueue;
the copy without Kueue's runtime patch."""

from __future__ import annotations

from decimal import Decimal

from dispatcher.kueue import workloads as wl
from dispatcher.standalone import decisions as d
from dispatcher.standalone.beside_kueue import kueue_claim
from dispatcher.standalone.mirror import build_remote
from trainjob import constants as c

CHECK = "multikueue-check"


def job(labels=None, annotations=None, placed=None, patches=None):
    meta = {"name": "j", "namespace": "ns", "uid": "u", "labels": labels or {},
            "annotations": dict(annotations or {})}
    if placed:
        meta["annotations"][c.PLACEMENT_ANNOTATION] = placed
    spec = {"managedBy": c.MANAGED_BY_MULTIKUEUE}
    if patches is not None:
        spec["runtimePatches"] = patches
    return {"metadata": meta, "spec": spec}


def test_kueue_claims_queued_jobs_and_its_copies_only():
    assert kueue_claim(job({c.KUEUE_QUEUE_NAME_LABEL: "q"})) == \
        f"it has the label {c.KUEUE_QUEUE_NAME_LABEL}=q"
    assert "a copy Kueue made" in kueue_claim(job(annotations={
        c.KUEUE_PREBUILT_WORKLOAD_LABEL: "w"}))
    # Kueue's webhook adds its runtime patch to every TrainJob: that alone says nothing.
    assert kueue_claim(job(patches=[{"manager": c.KUEUE_RUNTIME_PATCH_MANAGER}])) is None
    assert "manageJobsWithoutQueueName" in kueue_claim(job(), manage_without_queue_name=True)


def test_a_job_kueue_claims_is_left_to_it_unless_already_placed():
    settings = d.Settings(origin="o", worker_lost_timeout=60, retention=0)
    action = d.decide(job(), None, 0.0, settings, kueue_claim="why")
    assert action == d.LeaveToKueue(why="why"), action
    placed = d.decide(job(placed="w1"), d.WorkerState("w1"), 0.0, settings, kueue_claim="why")
    assert not isinstance(placed, d.LeaveToKueue), placed


def test_copies_go_without_kueues_runtime_patch():
    mine = {"manager": "example.com/mine"}
    remote = build_remote(job(patches=[{"manager": c.KUEUE_RUNTIME_PATCH_MANAGER}, mine]),
                          "o", {}, 1)
    assert remote["spec"]["runtimePatches"] == [mine], remote["spec"]
    only_kueue = build_remote(job(patches=[{"manager": c.KUEUE_RUNTIME_PATCH_MANAGER}]),
                              "o", {}, 1)
    assert "runtimePatches" not in only_kueue["spec"], only_kueue["spec"]


def workload(*, quota=True, check="Pending", cluster=None, nominated=None, podsets=None):
    status = {"conditions": [{"type": "QuotaReserved", "status": "True" if quota else "False"}],
              "admissionChecks": [{"name": CHECK, "state": check}]}
    if cluster:
        status["clusterName"] = cluster
    if nominated:
        status["nominatedClusterNames"] = nominated
    return {"metadata": {"name": "trainjob-j-1", "namespace": "ns",
                         "ownerReferences": [{"kind": "TrainJob", "name": "j",
                                              "controller": True}]},
            "spec": {"podSets": podsets if podsets is not None else []}, "status": status}


def test_a_workload_waits_with_quota_and_the_check_pending_and_no_cluster():
    assert wl.waiting(workload(), {CHECK}) == wl.Waiting(CHECK, ())
    assert wl.waiting(workload(nominated=["w1"]), {CHECK}).nominated == ("w1",)
    for not_waiting in (workload(quota=False), workload(check="Ready"),
                        workload(cluster="w1")):
        assert wl.waiting(not_waiting, {CHECK}) is None, not_waiting["status"]
    assert wl.waiting(workload(), {"another-check"}) is None
    assert wl.job_key(workload()) == ("ns", "j")


def podset(name, count, cpu, node_selector=None):
    spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"name": name, "count": count, "template": {"spec": spec}}


def test_needs_are_the_sum_over_podsets_and_nodes_filtered_by_the_widest():
    need = wl.podset_need(workload(podsets=[
        podset("init", 1, "500m"), podset("node", 4, "2", node_selector={"pool": "gpu"})]))
    assert (need.requests, need.pods, need.node_selector) == (
        {"cpu": Decimal("8.5")}, 5, {"pool": "gpu"}), need
    assert wl.podset_need(workload(podsets=[])) == "the Workload has no spec.podSets"


def test_status_of_a_job_kueue_dispatches_comes_from_its_workload():
    from dispatcher.job_state import job_summary

    trainjob = job({c.KUEUE_QUEUE_NAME_LABEL: "q"})
    trainjob["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    seen = {}
    for name, wl_ in (("queued", workload(quota=False)), ("reserved", workload()),
                      ("nominated", workload(nominated=["w2"])),
                      ("admitted", workload(cluster="w2"))):
        summary = job_summary(trainjob, wl_)
        seen[name] = (summary["state"], summary["worker"])
    assert seen == {"queued": ("Queued (Kueue)", ""), "reserved": ("QuotaReserved (Kueue)", ""),
                    "nominated": ("Nominated (Kueue)", "w2"),
                    "admitted": ("Admitted (Kueue)", "w2")}, seen
