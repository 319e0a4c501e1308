"""Placement: which worker a TrainJob goes to, and why the others did not take it (pure)."""

from decimal import Decimal as D

import pytest

from dispatcher.placement.chooser import Placement, describe_reasons, place_trainjob
from dispatcher.placement.policy import POLICIES, BestFit, Candidate, FirstFit, WorstFit
from dispatcher.room.amounts import format_amount
from dispatcher.room.capacity import WorkerCapacity
from trainjob import constants as c
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info

GPU = "nvidia.com/gpu"
GI = 2**30


def needs(**amounts):
    """Resources by keyword; ``gpu`` stands for nvidia.com/gpu."""
    return {GPU if k == "gpu" else k: D(str(v)) for k, v in amounts.items()}


def cand(name, order, problem=None, **free):
    return Candidate(name=name, order=order, free=needs(**free), problem=problem)


# --- fitting ----------------------------------------------------------------------------

def test_a_job_that_fits_only_on_worker_2_goes_there():
    placement = place_trainjob(needs(cpu=32), 4,
                               [cand("worker-1", 0, cpu=12), cand("worker-2", 1, cpu=48)],
                               BestFit())
    assert placement == Placement(cluster="worker-2",
                                  reasons={"worker-1": "needs 32 cpu, 12 free"})


def test_ineligible_workers_are_excluded_whatever_their_capacity():
    placement = place_trainjob(
        needs(cpu=4), 1,
        [cand("worker-1", 0, "runtime torch-distributed not found", cpu=1000),
         cand("worker-2", 1, cpu=8)], "best-fit")
    assert placement.cluster == "worker-2"
    assert placement.reasons == {"worker-1": "runtime torch-distributed not found"}


def test_exact_fit_fits():
    assert place_trainjob(needs(cpu=8, gpu=8), 2, [cand("w", 0, cpu=8, gpu=8)],
                          BestFit()).cluster == "w"


def test_jobs_without_requests_fit_anywhere_eligible():
    candidates = [cand("worker-1", 0, "not connected"), cand("worker-2", 1)]
    assert place_trainjob({}, 1, candidates, BestFit()).cluster == "worker-2"
    assert place_trainjob(needs(cpu=0), 0, candidates, WorstFit()).cluster == "worker-2"


def test_gpus_are_checked_by_resource_name():
    placement = place_trainjob(
        needs(cpu=8, gpu=8), 2,
        [cand("cpu-only", 0, cpu=500), cand("small-gpu", 1, cpu=64, gpu=4),
         cand("amd", 2, cpu=64, **{"amd.com/gpu": 8})], BestFit())
    assert placement.cluster is None
    assert placement.reasons == {
        "cpu-only": "needs 8 nvidia.com/gpu, 0 free",
        "small-gpu": "needs 8 nvidia.com/gpu, 4 free",
        "amd": "needs 8 nvidia.com/gpu, 0 free",
    }


def test_pod_slots_are_checked_when_the_worker_reports_them():
    assert place_trainjob(needs(cpu=1), 5, [cand("w", 0, cpu=64, pods=3)],
                          BestFit()).reasons == {"w": "needs 5 pods, 3 free"}
    # Nodes registered without a pods allocatable do not block placement.
    assert place_trainjob(needs(cpu=1), 5, [cand("w", 0, cpu=64)], BestFit()).cluster == "w"


# --- policies ---------------------------------------------------------------------------

def test_best_fit_chooses_the_tighter_worker():
    candidates = [cand("roomy", 0, cpu=100, gpu=8), cand("tight", 1, cpu=10, gpu=8)]
    assert place_trainjob(needs(cpu=8, gpu=8), 1, candidates, BestFit()).cluster == "tight"
    assert place_trainjob(needs(cpu=8, gpu=8), 1, candidates, WorstFit()).cluster == "roomy"


def test_best_fit_looks_at_every_requested_resource():
    # Mean leftover after placement: a: cpu 0, memory 0.97 -> 0.48; b: 0.5 and 0.5 -> 0.5.
    candidates = [cand("a", 0, cpu=8, memory=1024 * GI), cand("b", 1, cpu=16, memory=64 * GI)]
    assert place_trainjob(needs(cpu=8, memory=32 * GI), 1, candidates,
                          BestFit()).cluster == "a"
    # An equally roomy resource (same memory everywhere) does not decide: cpu does.
    candidates = [cand("small", 1, cpu=16, memory=512 * GI),
                  cand("big", 0, cpu=64, memory=511 * GI)]
    assert place_trainjob(needs(cpu=1, memory=1 * GI), 1, candidates,
                          BestFit()).cluster == "small"


def test_ties_are_broken_by_configuration_order_not_list_order():
    candidates = [cand("worker-b", 1, cpu=16), cand("worker-a", 0, cpu=16)]
    for policy in POLICIES.values():
        assert place_trainjob(needs(cpu=4), 1, candidates, policy).cluster == "worker-a"


def test_first_fit_takes_the_lowest_order_that_fits():
    candidates = [cand("w2", 2, cpu=100), cand("w0", 0, cpu=2), cand("w1", 1, cpu=64)]
    assert place_trainjob(needs(cpu=4), 1, candidates, FirstFit()).cluster == "w1"


def test_policies_are_named_and_selectable_by_name():
    assert {name: policy.name for name, policy in POLICIES.items()} == {
        "best-fit": "best-fit", "worst-fit": "worst-fit", "first-fit": "first-fit"}
    candidates = [cand("small", 0, cpu=8), cand("big", 1, cpu=64)]
    assert place_trainjob(needs(cpu=4), 1, candidates, "worst-fit").cluster == "big"
    assert place_trainjob(needs(cpu=4), 1, candidates).cluster == "small"  # best fit default
    with pytest.raises(ValueError, match="unknown placement policy 'random'"):
        place_trainjob(needs(cpu=4), 1, candidates, "random")


def test_a_custom_policy_plugs_in():
    class Last:
        name = "last"

        def choose(self, needs, candidates):
            return max(candidates, key=lambda c: c.order).name if candidates else None

    class Never:
        name = "never"

        def choose(self, needs, candidates):
            return None

    candidates = [cand("w0", 0, cpu=8), cand("w1", 1, cpu=8), cand("w2", 2, cpu=1)]
    assert place_trainjob(needs(cpu=4), 1, candidates, Last()).cluster == "w1"
    declined = place_trainjob(needs(cpu=4), 1, candidates, Never())
    assert declined.cluster is None
    assert describe_reasons(declined.reasons) == (
        "w0: fits, not chosen by never; w1: fits, not chosen by never; "
        "w2: needs 4 cpu, 1 free")


# --- reasons ----------------------------------------------------------------------------

def test_nothing_fits_gives_per_worker_reasons():
    placement = place_trainjob(
        needs(cpu=64), 8,
        [cand("worker-2", 1, cpu=12), cand("worker-1", 0, "runtime torch-distributed not found")],
        BestFit())
    assert placement.cluster is None
    assert describe_reasons(placement.reasons) == (
        "worker-1: runtime torch-distributed not found; worker-2: needs 64 cpu, 12 free")


def test_every_short_resource_is_named_in_people_units():
    placement = place_trainjob(
        needs(cpu="1.5", memory=256 * GI, gpu=8), 2,
        [cand("worker-1", 0, cpu="0.5", memory=48 * GI, gpu=8, pods=110)], BestFit())
    assert placement.reasons == {
        "worker-1": "needs 1.5 cpu, 0.5 free and 256Gi memory, 48Gi free"}


def test_problems_are_reported_verbatim():
    problems = ["not connected", "namespace team-a not found",
                "TrainJob team-a/x exists there without our origin label"]
    candidates = [cand(f"w{i}", i, problem) for i, problem in enumerate(problems)]
    placement = place_trainjob(needs(cpu=1), 1, candidates, BestFit())
    assert placement == Placement(
        cluster=None, reasons=dict(zip(["w0", "w1", "w2"], problems, strict=True)))


def test_no_workers_at_all():
    placement = place_trainjob(needs(cpu=1), 1, [], BestFit())
    assert placement == Placement(cluster=None, reasons={})
    assert describe_reasons(placement.reasons) == "no worker clusters"


def test_describe_reasons_sorts_by_worker_name():
    assert describe_reasons({"b": "y", "a": "x", "c": "z"}) == "a: x; b: y; c: z"


@pytest.mark.parametrize("resource, amount, text", [
    ("memory", 64 * GI, "64Gi"),
    ("memory", 1536 * 2**20, "1536Mi"),
    ("memory", 10**9, "1G"),
    ("memory", 12345, "12345"),
    ("memory", 0, "0"),
    ("ephemeral-storage", 2 * 2**40, "2Ti"),
    ("hugepages-2Mi", 2**21, "2Mi"),
    ("cpu", 64, "64"),
    ("cpu", D("0.25"), "0.25"),
    (GPU, 8, "8"),
])
def test_format_amount(resource, amount, text):
    assert format_amount(resource, D(amount)) == text


# --- with the real capacity picture and the operator's totals --------------------------

def node(name, cpu, gpu=0):
    allocatable = {"cpu": str(cpu), "memory": "512Gi", "pods": "110"}
    if gpu:
        allocatable[GPU] = str(gpu)
    return {"metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def worker(name, *nodes):
    capacity = WorkerCapacity(name)
    for n in nodes:
        capacity.on_node("ADDED", None, n)
    return capacity


def burst(workers, policy, jobs=20, cpu=8, reserve=True):
    """Place ``jobs`` jobs one after another; returns the chosen worker per job."""
    chosen = []
    for i in range(jobs):
        candidates = [Candidate(name, order, capacity.free())
                      for order, (name, capacity) in enumerate(workers.items())]
        placement = place_trainjob({"cpu": D(cpu)}, 1, candidates, policy)
        chosen.append(placement.cluster)
        if placement.cluster and reserve:
            workers[placement.cluster].reserve(("team-a", f"job-{i}"), {"cpu": D(cpu)}, 1)
    return chosen


def test_a_burst_spreads_instead_of_overcommitting_one_worker():
    workers = {"worker-1": worker("worker-1", node("a", 48), node("b", 48)),
               "worker-2": worker("worker-2", node("c", 96))}
    chosen = burst(workers, BestFit())
    # Best fit packs worker-1 until it is full, then moves on: 12 x 8 = 96 cpu.
    assert chosen == ["worker-1"] * 12 + ["worker-2"] * 8
    assert workers["worker-1"].free()["cpu"] == 0
    assert workers["worker-2"].free()["cpu"] == 32
    # Both full: the next job waits with a reason instead of overcommitting.
    candidates = [Candidate(n, i, w.free()) for i, (n, w) in enumerate(workers.items())]
    more = place_trainjob({"cpu": D(48)}, 1, candidates, BestFit())
    assert describe_reasons(more.reasons) == (
        "worker-1: needs 48 cpu, 0 free; worker-2: needs 48 cpu, 32 free")


def test_without_reservations_a_burst_piles_onto_one_worker():
    # Why reservations exist: without them every decision sees the same free capacity.
    workers = {"worker-1": worker("worker-1", node("a", 96)),
               "worker-2": worker("worker-2", node("c", 96))}
    assert burst(workers, BestFit(), reserve=False) == ["worker-1"] * 20  # 160 cpu on 96


def test_worst_fit_burst_alternates():
    workers = {"worker-1": worker("worker-1", node("a", 96)),
               "worker-2": worker("worker-2", node("c", 96))}
    chosen = burst(workers, WorstFit())
    assert chosen == ["worker-1", "worker-2"] * 10


def test_needs_come_from_the_operators_podset_totals():
    runtime = TrainingRuntime.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.CLUSTERTRAININGRUNTIME_KIND,
        "metadata": {"name": "plain"},
        "spec": {"template": {"spec": {"replicatedJobs": [{
            "name": c.NODE,
            "template": {"metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                         "spec": {"template": {"spec": {"containers": [
                             {"name": c.NODE, "image": "trainer"}]}}}}}]}}}})
    job = TrainJob.model_validate({
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "llm", "namespace": "team-a"},
        "spec": {"runtimeRef": {"name": "plain"}, "trainer": {
            "numNodes": 4,
            "resourcesPerNode": {"requests": {"cpu": "4", GPU: "2"}}}}})
    totals = build_runtime_info(job, runtime).totals
    assert totals.requests == {"cpu": D(16), GPU: D(8)}

    workers = {"worker-1": worker("worker-1", node("a", 64, gpu=4)),
               "worker-2": worker("worker-2", node("b", 32, gpu=4), node("c", 32, gpu=4))}
    candidates = [Candidate(n, i, w.free()) for i, (n, w) in enumerate(workers.items())]
    placement = place_trainjob(totals.requests, totals.pods, candidates, BestFit())
    assert placement == Placement(cluster="worker-2",
                                  reasons={"worker-1": "needs 8 nvidia.com/gpu, 4 free"})


# --- what the Placer gives the chooser -------------------------------------------------

def test_a_candidates_own_needs_stand_for_the_jobs_totals():
    # Each worker holds its own copy of the runtime: the job can ask more of one than of
    # another. Ranking weighs the largest need of those that fit.
    candidates = [Candidate("small-runtime", 0, needs(cpu=16), needs=needs(cpu=4), pods=1),
                  Candidate("big-runtime", 1, needs(cpu=64), needs=needs(cpu=80), pods=1),
                  Candidate("roomy", 2, needs(cpu=64), needs=needs(cpu=4), pods=1)]
    placement = place_trainjob({}, 0, candidates, BestFit())
    assert placement == Placement(cluster="small-runtime",
                                  reasons={"big-runtime": "needs 80 cpu, 64 free"})


def test_a_shortfall_names_the_rules_that_keep_nodes_out():
    candidates = [Candidate("w", 0, needs(cpu=2), excluded_nodes=(
        "Nodes excluded: 1 with taint gpu=true:NoSchedule (not tolerated)"))]
    assert place_trainjob(needs(cpu=4), 1, candidates).reasons == {
        "w": "needs 4 cpu, 2 free (Nodes excluded: 1 with taint gpu=true:NoSchedule "
             "(not tolerated))"}
