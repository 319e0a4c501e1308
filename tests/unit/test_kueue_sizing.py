"""Sizing a Kueue Workload from its podSets (pure): partial admission (``minCount``) and the
Workloads this dispatcher cannot size, whatever the job kind behind them."""

from __future__ import annotations

from decimal import Decimal

from dispatcher.kueue import workloads as wl


def workload(*podsets: dict, queue: str | None = "user-queue") -> dict:
    spec: dict = {"podSets": list(podsets)}
    if queue:
        spec["queueName"] = queue
    return {"metadata": {"name": "job-j-1", "namespace": "ns",
                         "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}]},
            "spec": spec}


def podset(name: str, count: int, cpu: str = "1", min_count: int | None = None,
           **spec) -> dict:
    template = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}], **spec}
    body = {"name": name, "count": count, "template": {"spec": template}}
    if min_count is not None:
        body["minCount"] = min_count
    return body


def test_a_partially_admissible_workload_is_sized_by_count_unless_asked_for_its_minimum():
    # A batch Job with parallelism 4 and kueue.x-k8s.io/job-min-parallelism: 2, as Kueue
    # writes its Workload.
    job = workload(podset("main", 4, cpu="2", min_count=2))
    assert wl.partially_admissible(job)
    whole = wl.podset_need(job)
    assert (whole.requests, whole.pods, len(whole.each_pod)) == ({"cpu": Decimal(8)}, 4, 4), whole
    least = wl.podset_need(job, at_min_count=True)
    assert (least.requests, least.pods, len(least.each_pod)) == ({"cpu": Decimal(4)}, 2, 2), least
    assert least.queue == whole.queue == ("ns", "user-queue")


def test_only_the_podset_with_a_min_count_shrinks_at_its_minimum():
    job = workload(podset("launcher", 1, cpu="500m"), podset("workers", 6, cpu="1", min_count=3))
    least = wl.podset_need(job, at_min_count=True)
    assert (least.requests, least.pods) == ({"cpu": Decimal("3.5")}, 4), least
    assert (wl.podset_need(job).requests, wl.podset_need(job).pods) == (
        {"cpu": Decimal("6.5")}, 7)


def test_a_workload_without_min_count_or_with_min_count_equal_to_count_is_not_partial():
    for job in (workload(podset("main", 3)), workload(podset("main", 3, min_count=3))):
        assert not wl.partially_admissible(job), job
        assert wl.podset_need(job, at_min_count=True).pods == wl.podset_need(job).pods == 3


def test_pod_level_resources_make_a_workload_unsizable_and_name_the_podset_and_field():
    job = workload(podset("main", 2),
                   podset("side", 1, resources={"requests": {"cpu": "2", "memory": "1Gi"}}))
    why = wl.podset_need(job)
    assert why == ("spec.podSets[1] (side): template.spec.resources (cpu, memory) sets "
                   "pod-level resources, which this dispatcher does not read (it counts "
                   "container requests only)"), why
    assert wl.podset_need(job, at_min_count=True) == why


def test_dra_resource_claims_make_a_workload_unsizable():
    job = workload(podset("main", 1, resourceClaims=[
        {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]))
    assert wl.podset_need(job) == (
        "spec.podSets[0] (main): template.spec.resourceClaims (gpu) asks for devices through "
        "Dynamic Resource Allocation, which this dispatcher does not count")


def test_a_request_that_is_not_a_quantity_makes_a_workload_unsizable_instead_of_failing():
    job = workload(podset("main", 1, cpu="-1"))
    why = wl.podset_need(job)
    assert isinstance(why, str) and why.startswith("spec.podSets[0] (main): ") and \
        "resources.requests.cpu '-1' is not a non-negative quantity" in why, why


def test_the_sized_condition_is_found_among_kueues():
    job = workload(podset("main", 1))
    assert wl.sized_condition(job) is None
    mine = {"type": wl.SIZED_CONDITION, "status": "False", "reason": wl.UNSIZABLE_REASON}
    job["status"] = {"conditions": [{"type": "QuotaReserved", "status": "True"}, mine]}
    assert wl.sized_condition(job) == mine


def test_a_batch_jobs_bound_pods_supersede_its_reservation_like_a_jobsets():
    """A Kueue-dispatched batch Job holds room under its own name (its Workload's owner):
    its pods, labelled by the job controller, account for it once bound."""
    from dispatcher.room.capacity import BATCH_JOB_NAME_LABEL, WorkerCapacity

    capacity = WorkerCapacity()
    capacity.on_node("ADDED", None, {
        "metadata": {"name": "n", "labels": {}}, "spec": {},
        "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "10"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    job = wl.job_key(workload(podset("main", 2, cpu="2")))
    capacity.reserve(job, {"cpu": Decimal(4)}, pods=2)
    assert capacity.free()["cpu"] == Decimal(4)
    for index in range(2):
        capacity.on_pod("ADDED", None, {
            "metadata": {"name": f"j-{index}", "namespace": "ns",
                         "labels": {BATCH_JOB_NAME_LABEL: "j"}},
            "spec": {"nodeName": "n", "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
            "status": {"phase": "Running"}})
    assert capacity.free()["cpu"] == Decimal(4), (
        "expected the bound pods to take the reservation's place, not to add to it")
