"""WorkerCapacity: the incremental, watch-fed capacity picture of one worker (pure)."""

import copy
import threading
from decimal import Decimal as D

import pytest

from dispatcher.room import arrival
from dispatcher.room.capacity import (
    ARRIVAL_WINDOW_SECONDS,
    MOST_ALLOCATED,
    WorkerCapacity,
    admits,
    pod_requests,
    tolerates,
)
from trainjob.constants import JOBSET_NAME_LABEL

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
GPU = "nvidia.com/gpu"


def node(name, *, cpu=8, memory="32Gi", gpu=None, extra=None, ready=True,
         unschedulable=False, labels=None, taints=None):
    allocatable = {"cpu": str(cpu), "memory": memory, "pods": "110", **(extra or {})}
    if gpu is not None:
        allocatable[GPU] = str(gpu)
    spec = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(name, *, node_name=None, phase="Running", cpu=None, memory=None, gpu=None,
        job=None, namespace="team-a", limits=None, init=None):
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory), (GPU, gpu)) if v}
    resources = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec = {"containers": [{"name": "main", "resources": resources}]}
    if init:
        spec["initContainers"] = init
    if node_name:
        spec["nodeName"] = node_name
    labels = {JOBSET_NAME_LABEL: job} if job else {}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": spec, "status": {"phase": phase}}


def add_nodes(capacity, *nodes):
    for n in nodes:
        capacity.on_node(ADDED, None, n)


# --- nodes ------------------------------------------------------------------------------

def test_only_ready_schedulable_nodes_count():
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a"), node("b", ready=False), node("c", unschedulable=True))
    assert capacity.free() == {"cpu": D(8), "memory": D(32 * 2**30), "pods": D(110)}
    assert capacity.summary()["nodes"] == 3
    assert capacity.summary()["usableNodes"] == 1


def test_node_without_ready_condition_is_not_usable():
    capacity = WorkerCapacity()
    bare = node("a")
    bare["status"]["conditions"] = []
    add_nodes(capacity, bare)
    assert capacity.free() == {}


def test_node_becoming_ready_then_deleted():
    capacity = WorkerCapacity()
    not_ready = node("a", ready=False)
    capacity.on_node(ADDED, None, not_ready)
    assert capacity.free() == {}
    ready = node("a")
    capacity.on_node(MODIFIED, not_ready, ready)
    assert capacity.free()["cpu"] == 8
    cordoned = node("a", unschedulable=True)
    capacity.on_node(MODIFIED, ready, cordoned)
    assert capacity.free() == {}
    capacity.on_node(MODIFIED, cordoned, ready)
    capacity.on_node(DELETED, ready, None)
    assert capacity.free() == {}
    assert capacity.summary()["nodes"] == 0


def test_gpus_and_extended_resources_by_name():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("g1", gpu=8), node("g2", gpu=4),
              node("plain", extra={"example.com/fpga": "2"}))
    free = capacity.free()
    assert free[GPU] == 12
    assert free["example.com/fpga"] == 2
    assert free["cpu"] == 24


def test_malformed_allocatable_value_is_skipped_not_fatal():
    capacity = WorkerCapacity()
    bad = node("a")
    bad["status"]["allocatable"]["example.com/odd"] = "lots"
    add_nodes(capacity, bad)
    assert capacity.free()["cpu"] == 8
    assert "example.com/odd" not in capacity.free()


# --- nodeSelector, taints and tolerations ------------------------------------------------

def test_node_selector_needs_every_label():
    capacity = WorkerCapacity()
    add_nodes(capacity,
              node("a", labels={"pool": "gpu", "zone": "z1"}, cpu=10),
              node("b", labels={"pool": "gpu", "zone": "z2"}, cpu=20),
              node("c", labels={"pool": "cpu"}, cpu=40))
    assert capacity.free({"pool": "gpu"})["cpu"] == 30
    assert capacity.free({"pool": "gpu", "zone": "z2"})["cpu"] == 20
    assert capacity.free({"pool": "tpu"}) == {}
    assert capacity.free({})["cpu"] == 70
    assert capacity.free(None)["cpu"] == 70


GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize("toleration, expected", [
    ({"key": GPU, "operator": "Exists"}, True),
    ({"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": GPU, "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": GPU, "operator": "Equal", "value": "present"}, True),
    ({"key": GPU, "value": "present"}, True),  # no operator means Equal
    ({"key": GPU, "operator": "Equal", "value": "absent"}, False),
    ({"key": GPU, "operator": "Equal"}, False),  # empty value != "present"
    ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
    ({"operator": "Exists", "effect": "NoSchedule"}, True),
    ({"operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": GPU, "operator": "Gt", "value": "1"}, False),  # unknown operator
])
def test_toleration_matching(toleration, expected):
    assert tolerates(toleration, GPU_TAINT) is expected


def test_taint_without_value_matches_exists_and_equal_with_empty_value():
    taint = {"key": "dedicated", "effect": "NoExecute"}
    assert tolerates({"key": "dedicated", "operator": "Exists"}, taint)
    assert tolerates({"key": "dedicated", "operator": "Equal", "value": ""}, taint)
    assert not tolerates({"key": "dedicated", "operator": "Equal", "value": "x"}, taint)


def test_only_blocking_effects_keep_pods_off():
    soft = [{"key": "k", "value": "v", "effect": "PreferNoSchedule"}]
    hard = [{"key": "k", "value": "v", "effect": "NoExecute"}]
    assert admits({}, soft, None, None)
    assert not admits({}, hard, None, None)
    assert admits({}, hard, None, [{"key": "k", "operator": "Equal", "value": "v"}])
    # Every blocking taint must be tolerated, not just one.
    two = hard + [{"key": "j", "effect": "NoSchedule"}]
    assert not admits({}, two, None, [{"key": "k", "operator": "Exists"}])
    assert admits({}, two, None, [{"key": "k", "operator": "Exists"},
                                  {"key": "j", "operator": "Exists"}])


def test_free_counts_only_nodes_whose_taints_are_tolerated():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("cpu-node", cpu=16),
              node("gpu-node", cpu=32, gpu=8, taints=[GPU_TAINT]))
    assert capacity.free() == {"cpu": D(16), "memory": D(32 * 2**30), "pods": D(110)}
    tolerant = capacity.free(None, [{"key": GPU, "operator": "Exists"}])
    assert tolerant["cpu"] == 48 and tolerant[GPU] == 8
    everything = capacity.free(None, [{"operator": "Exists"}])
    assert everything == tolerant


# --- pods -------------------------------------------------------------------------------

def test_bound_pods_use_their_node():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    capacity.on_pod(ADDED, None, pod("p1", node_name="a", cpu="3", memory="4Gi"))
    capacity.on_pod(ADDED, None, pod("p2", node_name="b", cpu="500m"))
    free = capacity.free()
    assert free["cpu"] == D("12.5")
    assert free["memory"] == 60 * 2**30
    assert free["pods"] == 218
    summary = capacity.summary()
    assert summary["used"] == {"cpu": "3500m", "memory": str(4 * 2**30), "pods": "2"}
    assert summary["free"]["cpu"] == "12500m"


def test_unbound_pod_counts_once_bound():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8))
    pending = pod("p", cpu="2", phase="Pending")
    capacity.on_pod(ADDED, None, pending)
    assert capacity.free()["cpu"] == 8  # the scheduler has not given it a node yet
    bound = copy.deepcopy(pending)
    bound["spec"]["nodeName"] = "a"
    capacity.on_pod(MODIFIED, pending, bound)
    assert capacity.free()["cpu"] == 6
    running = copy.deepcopy(bound)
    running["status"]["phase"] = "Running"
    capacity.on_pod(MODIFIED, bound, running)  # an update does not count it twice
    assert capacity.free()["cpu"] == 6


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pods_release_their_node(phase):
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8))
    running = pod("p", node_name="a", cpu="6")
    capacity.on_pod(ADDED, None, running)
    assert capacity.free()["cpu"] == 2
    done = copy.deepcopy(running)
    done["status"]["phase"] = phase
    capacity.on_pod(MODIFIED, running, done)
    assert capacity.free()["cpu"] == 8
    capacity.on_pod(DELETED, done, None)
    assert capacity.free()["cpu"] == 8


def test_deleted_pod_frees_its_node_and_repeated_events_do_not_drift():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8))
    p = pod("p", node_name="a", cpu="4")
    capacity.on_pod(ADDED, None, p)
    capacity.on_pod(ADDED, None, p)  # a relist may deliver the same pod again
    assert capacity.free()["cpu"] == 4
    bigger = pod("p", node_name="a", cpu="5")
    capacity.on_pod(MODIFIED, p, bigger)
    assert capacity.free()["cpu"] == 3
    capacity.on_pod(DELETED, bigger, None)
    assert capacity.free()["cpu"] == 8
    capacity.on_pod(DELETED, bigger, None)  # deleting twice is harmless
    assert capacity.free()["cpu"] == 8
    assert capacity.summary()["used"] == {}


def test_pod_moving_between_nodes_and_nodes_arriving_after_their_pods():
    capacity = WorkerCapacity()
    capacity.on_pod(ADDED, None, pod("p", node_name="late", cpu="3"))
    add_nodes(capacity, node("late", cpu=8))
    assert capacity.free()["cpu"] == 5  # pods seen before their node still count
    add_nodes(capacity, node("other", cpu=8))
    capacity.on_pod(MODIFIED, None, pod("p", node_name="other", cpu="3"))
    free = capacity.free()
    assert free["cpu"] == 13


def test_usage_is_clamped_per_node():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("full", cpu=4), node("empty", cpu=4))
    capacity.on_pod(ADDED, None, pod("big", node_name="full", cpu="6"))  # overcommitted
    assert capacity.free()["cpu"] == 4  # not 2: "full" cannot take from "empty"


def test_pods_on_unusable_or_unselected_nodes_do_not_matter():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8, labels={"pool": "x"}), node("b", cpu=8, ready=False))
    capacity.on_pod(ADDED, None, pod("p", node_name="b", cpu="8"))
    assert capacity.free({"pool": "x"})["cpu"] == 8


def test_pod_requests_follow_podset_rules():
    # limits stand in for missing requests; sidecars add up; plain init containers max.
    p = pod("p", node_name="a", cpu="1", limits={"memory": "1Gi", GPU: "2"}, init=[
        {"name": "sidecar", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"name": "setup", "resources": {"requests": {"cpu": "4"}}},
    ])
    p["spec"]["overhead"] = {"cpu": "100m"}
    before = copy.deepcopy(p)
    assert pod_requests(p) == {"cpu": D("4.1"), "memory": D(2 * 2**30), GPU: D(2),
                               "pods": D(1)}
    assert p == before  # the informer's cached object is not touched


# --- reservations -----------------------------------------------------------------------

def test_reservation_counted_then_superseded_by_pods_then_released():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=16, gpu=8))
    job = ("team-a", "train")
    capacity.reserve(job, {"cpu": D(8), GPU: D(4)}, pods=2)
    free = capacity.free()
    assert (free["cpu"], free[GPU], free["pods"]) == (8, 4, 108)
    assert capacity.summary()["reserved"] == {"cpu": "8", GPU: "4", "pods": "2"}

    # One pod bound: the reservation only covers what is not running yet.
    p0 = pod("train-node-0", node_name="a", cpu="4", gpu="2", job="train")
    capacity.on_pod(ADDED, None, p0)
    assert (capacity.free()["cpu"], capacity.free()[GPU]) == (8, 4)
    # All pods bound: the pods are counted, the reservation adds nothing.
    p1 = pod("train-node-1", node_name="a", cpu="4", gpu="2", job="train")
    capacity.on_pod(ADDED, None, p1)
    assert (capacity.free()["cpu"], capacity.free()[GPU]) == (8, 4)
    assert capacity.summary()["reserved"] == {}

    # The pods finish before the dispatcher releases: the reservation counts again.
    for p in (p0, p1):
        capacity.on_pod(DELETED, p, None)
    assert capacity.free()["cpu"] == 8
    capacity.release(job)
    assert capacity.free()["cpu"] == 16
    capacity.release(job)  # idempotent
    assert capacity.summary()["reservations"] == 0


def test_reservation_not_superseded_by_other_jobs_or_namespaces():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=32))
    capacity.reserve(("team-a", "train"), {"cpu": D(8)}, pods=1)
    capacity.on_pod(ADDED, None, pod("x", node_name="a", cpu="8", job="other"))
    capacity.on_pod(ADDED, None, pod("y", node_name="a", cpu="8", job="train",
                                     namespace="team-b"))
    assert capacity.free()["cpu"] == 8  # 32 - 8 - 8 - reservation 8


def test_unbound_pods_of_a_reserved_job_stay_covered():
    # Pods that exist but wait for the scheduler must not make the job vanish from the
    # picture, or a burst would pile onto a worker whose pods are all pending.
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=16))
    capacity.reserve(("team-a", "train"), {"cpu": D(8)}, pods=2)
    capacity.on_pod(ADDED, None, pod("train-0", cpu="4", job="train", phase="Pending"))
    capacity.on_pod(ADDED, None, pod("train-1", cpu="4", job="train", phase="Pending"))
    assert capacity.free()["cpu"] == 8


def test_reserve_replaces_and_reservations_come_off_every_selection():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8, labels={"pool": "x"}), node("b", cpu=8))
    job = ("team-a", "train")
    capacity.reserve(job, {"cpu": D(2)}, pods=1)
    capacity.reserve(job, {"cpu": D(6)}, pods=1)  # re-placing replaces, never adds up
    assert capacity.free()["cpu"] == 10
    # Not tied to nodes, so conservatively subtracted from any selection; clamped at 0.
    assert capacity.free({"pool": "x"})["cpu"] == 2
    capacity.reserve(("team-a", "huge"), {"cpu": D(100), GPU: D(1)}, pods=1)
    free = capacity.free({"pool": "x"})
    assert free["cpu"] == 0
    assert GPU not in free  # no node offers GPUs; a reservation does not invent them


def test_a_planned_reservation_takes_room_only_on_its_nodes():
    """Jobs packed onto one pool's Nodes leave another pool's room alone (many placed jobs
    without pods yet on a big Node must not make a small pool look full)."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("big", cpu=64, labels={"pool": "big"}),
              node("pool-1", cpu=8, labels={"pool": "x"}))
    for i in range(20):
        job = ("team-a", f"job-{i}")
        plan = capacity.pack([{"cpu": D(3)}], {"pool": "big"})
        assert plan == {"big": {"cpu": D(3), "pods": D(1)}}, (i, plan)
        capacity.reserve(job, {"cpu": D(3)}, pods=1, planned=plan)
    assert capacity.free({"pool": "x"})["cpu"] == 8
    assert capacity.free()["cpu"] == 64 + 8 - 60
    # Its pods bound where planned: the plan is used up, not counted twice.
    capacity.on_pod(ADDED, None, pod("p", node_name="big", cpu="3", job="job-0"))
    assert capacity.free()["cpu"] == 64 + 8 - 60
    capacity.release(("team-a", "job-0"))
    capacity.on_pod(DELETED, pod("p", node_name="big", cpu="3", job="job-0"), None)
    assert capacity.free()["cpu"] == 64 + 8 - 57
    for i in range(1, 20):
        capacity.release(("team-a", f"job-{i}"))
    assert capacity.free()["cpu"] == 72 and "big" not in capacity._node_planned


def test_summary_is_strings():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu="7500m", memory="1Gi"), node("b", ready=False))
    capacity.on_pod(ADDED, None, pod("p", node_name="a", cpu="250m"))
    capacity.reserve(("ns", "j"), {"cpu": D("0.25")}, pods=1)
    assert capacity.summary() == {
        "nodes": 2, "usableNodes": 1, "reservations": 1,
        "allocatable": {"cpu": "7500m", "memory": str(2**30), "pods": "110"},
        "used": {"cpu": "250m", "pods": "1"},
        "reserved": {"cpu": "250m", "pods": "1"},
        "free": {"cpu": "7", "memory": str(2**30), "pods": "108"},
    }


def run_alongside(writers: list[threading.Thread], readers: list[threading.Thread],
                  running: threading.Event) -> None:
    """Run ``readers`` (which loop while ``running`` is set) alongside ``writers``, until
    the writers are done."""
    running.set()
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    running.clear()
    for thread in readers:
        thread.join()


def test_concurrent_events_and_reads_keep_totals_exact():
    """Eight threads churn pods and reservations while two read: every read finds the kept
    sums equal to a recount from scratch (``check``), and what is used, held and free at
    any moment adds up to what the Node allocates; at the end nothing is left counted."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=1000))
    errors = []
    churning = threading.Event()

    def churn(prefix):
        for i in range(200):
            p = pod(f"{prefix}-{i}", node_name="a", cpu="1", job=prefix)
            capacity.on_pod(ADDED, None, p)
            capacity.reserve(("team-a", prefix), {"cpu": D(1)}, pods=1)
            capacity.on_pod(DELETED, p, None)
            capacity.release(("team-a", prefix))

    def read():
        reads = 0
        while churning.is_set() or reads < 10:
            reads += 1
            try:
                capacity.check()
                totals = capacity.totals()
                used = totals["used"].get("cpu", D(0))
                held = totals["reserved"].get("cpu", D(0))
                if used + held + totals["free"]["cpu"] != 1000 or used > 8 or held > 8:
                    errors.append(f"read {reads}: used {used} held {held} "
                                  f"free {totals['free']['cpu']}")
            except AssertionError as err:
                errors.append(f"read {reads}: {err}")

    run_alongside([threading.Thread(target=churn, args=(f"t{n}",)) for n in range(8)],
                  [threading.Thread(target=read) for _ in range(2)], churning)
    assert errors == []
    assert capacity.free()["cpu"] == 1000
    assert capacity.summary()["used"] == {} and capacity.summary()["reserved"] == {}


def test_running_reservation_total_equals_a_full_recount_under_random_events():
    import random

    rng = random.Random(7)
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a", cpu=1000, memory="1000Gi"))
    jobs = [("team-a", f"job-{i}") for i in range(12)]
    for step in range(3000):
        job = rng.choice(jobs)
        action = rng.random()
        if action < 0.3:
            capacity.reserve(job, {"cpu": D(rng.randint(1, 8))}, rng.randint(1, 4))
        elif action < 0.4:
            capacity.release(job)
        else:
            name = f"{job[1]}-pod-{rng.randint(0, 5)}"
            kind = DELETED if action > 0.85 else MODIFIED
            obj = pod(name, node_name=rng.choice(["a", None]), cpu=str(rng.randint(1, 3)),
                      job=job[1])
            capacity.on_pod(kind, obj if kind == DELETED else None,
                            None if kind == DELETED else obj)
        expected: dict = {}
        for key, reserved in capacity._reserved.items():
            bound = capacity._job_used.get(key, {})
            for resource, amount in reserved.items():
                left = amount - bound.get(resource, D(0))
                if left > 0:
                    expected[resource] = expected.get(resource, D(0)) + left
        assert capacity._counted_reservations() == expected, f"step {step}"
        capacity.check()


def test_nodes_kept_out_by_a_rule_are_named_with_the_rule():
    capacity = WorkerCapacity("w")
    add_nodes(capacity,
              node("plain-1", cpu=64), node("plain-2", cpu=64),
              node("gpu", cpu=8, labels={"pool": "gpu"},
                   taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}]),
              node("down", cpu=8, ready=False))
    said = capacity.excluded_by_rules({"pool": "gpu"}, [])
    assert said == ("Nodes excluded: 1 not Ready or cordoned, 1 with taint "
                    "gpu=true:NoSchedule (not tolerated), 2 without label pool=gpu "
                    "(nodeSelector)")
    tolerated = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert capacity.excluded_by_rules({"pool": "gpu"}, tolerated) == (
        "Nodes excluded: 1 not Ready or cordoned, 2 without label pool=gpu (nodeSelector)")
    assert capacity.excluded_by_rules(None, None) == (
        "Nodes excluded: 1 not Ready or cordoned, 1 with taint gpu=true:NoSchedule "
        "(not tolerated)")


# --- packing pods onto Nodes ------------------------------------------------------------

def test_room_in_sum_is_not_room_on_a_node():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    assert capacity.free()["cpu"] == 16
    refused = capacity.pack([{"cpu": D(12)}])
    assert refused == "no Node has room for a pod of 12 cpu (most free on one Node: 8)"
    plan = capacity.pack([{"cpu": D(6)}, {"cpu": D(6)}])
    assert sorted(plan) == ["a", "b"], plan  # one pod per Node: 6 + 6 do not share 8


def test_pods_go_where_the_default_scheduler_puts_them():
    # LeastAllocated (kube-scheduler's default) scores cpu and memory over what each Node
    # allocates: the emptiest Node wins, so a job's pods spread.
    capacity = WorkerCapacity()
    add_nodes(capacity, node("small", cpu=4), node("large", cpu=32))
    assert capacity.pack([{"cpu": D(3)}]) == {"large": {"cpu": D(3), "pods": D(1)}}
    spread = WorkerCapacity()
    add_nodes(spread, node("a", cpu=8), node("b", cpu=8))
    assert spread.pack([{"cpu": D(2)}, {"cpu": D(2)}]) == {
        "a": {"cpu": D(2), "pods": D(1)}, "b": {"cpu": D(2), "pods": D(1)}}


def test_bin_packing_workers_are_predicted_with_most_allocated():
    capacity = WorkerCapacity(scoring=MOST_ALLOCATED)
    add_nodes(capacity, node("small", cpu=4), node("large", cpu=32))
    assert capacity.pack([{"cpu": D(3)}]) == {"small": {"cpu": D(3), "pods": D(1)}}
    assert list(capacity.pack([{"cpu": D(6)}])) == ["large"]
    packed = WorkerCapacity(scoring=MOST_ALLOCATED)
    add_nodes(packed, node("a", cpu=8), node("b", cpu=8))
    assert packed.pack([{"cpu": D(2)}, {"cpu": D(2)}]) == {"a": {"cpu": D(4), "pods": D(2)}}


def test_a_spread_worker_refuses_what_its_scheduler_could_not_place():
    """Two 4-cpu jobs on two 8-cpu Nodes land one per Node under the default scheduler, so
    an 8-cpu pod after them fits nowhere, whatever the sum says. Packing them onto one Node
    on paper let the dispatcher send that pod to be stuck unschedulable."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    for name in ("first", "second"):
        plan = capacity.pack([{"cpu": D(4)}])
        capacity.reserve(("team-a", name), {"cpu": D(4)}, pods=1, planned=plan)
        # The copy's own events re-reserve its footprint: the plan stays.
        capacity.reserve(("team-a", name), {"cpu": D(4)}, pods=1)
    assert capacity.free()["cpu"] == 8
    assert capacity.pack([{"cpu": D(8)}]) == (
        "no Node has room for a pod of 8 cpu (most free on one Node: 4)")
    # Another footprint (the job changed) drops the plan, which says nothing of the new
    # pods: the reservation holds no room on Node a any more, only in the sum.
    capacity.reserve(("team-a", "first"), {"cpu": D(6)}, pods=1)
    assert capacity.free()["cpu"] == 6
    # So Node a has room for an 8-cpu pod, but the first job's pod, wherever it lands,
    # could take it first: the job waits for the pods in flight to bind.
    assert capacity.pack([{"cpu": D(8)}]).startswith(
        "pods of jobs placed here moments ago are not bound yet")
    # It did, on b: the second job's pod must now go to a, and 8 cpu fit nowhere.
    _bind(capacity, "first", 0, "b", 6)
    assert capacity.pack([{"cpu": D(8)}]) == (
        "no Node has room for a pod of 8 cpu (most free on one Node: 4)")


def test_a_planned_job_keeps_its_room_on_its_nodes_until_its_pods_take_it():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    job = ("team-a", "first")
    plan = capacity.pack([{"cpu": D(6)}])
    capacity.reserve(job, {"cpu": D(6)}, pods=1, planned=plan)
    (taken,) = plan
    # The next job packs around the first one's planned room.
    second = capacity.pack([{"cpu": D(6)}])
    assert list(second) != [taken], second
    assert isinstance(capacity.pack([{"cpu": D(6)}, {"cpu": D(6)}]), str)
    # Its pod binds where planned: the room is counted once, as the pod's.
    capacity.on_pod(ADDED, None, pod("first-node-0", node_name=taken, cpu="6", job="first"))
    assert list(capacity.pack([{"cpu": D(6)}])) != [taken]
    capacity.release(job)
    assert list(capacity.pack([{"cpu": D(6)}])) != [taken]  # its pod still runs there


def test_packing_follows_node_selectors_and_names_what_no_node_has():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("cpu-only", cpu=64), node("gpu", cpu=8, gpu=4,
                                                         labels={"pool": "gpu"}))
    assert list(capacity.pack([{"cpu": D(2), GPU: D(2)}])) == ["gpu"]
    assert capacity.pack([{GPU: D(8)}]) == (
        f"no Node has room for a pod of 8 {GPU} (most free on one Node: 4)")
    assert capacity.pack([{"cpu": D(16)}], node_selector={"pool": "gpu"}) == (
        "no Node has room for a pod of 16 cpu (most free on one Node: 8)")
    assert capacity.pack([{"cpu": D(1)}], node_selector={"pool": "none"}) == (
        "no Node admits its pods")



def _placed(capacity, name, *pods):
    """Pack and reserve a job of ``pods`` (cpu each), as the placer does; its plan."""
    plan = capacity.pack([{"cpu": D(cpu)} for cpu in pods])
    assert not isinstance(plan, str), plan
    capacity.reserve(("team-a", name), {"cpu": D(sum(pods))}, pods=len(pods), planned=plan)
    return plan


def _bind(capacity, job, index, node_name, cpu):
    capacity.on_pod(ADDED, None, pod(f"{job}-node-0-{index}", node_name=node_name,
                                     cpu=str(cpu), job=job))


def test_a_pod_bound_off_its_plan_leaves_no_room_counted_twice_or_lost():
    """The scheduler breaks ties at random: a small job planned on Node a was bound on b,
    beside a wide job's pod. The small job still unbound will now go to a; had the
    room it was planned on b been clamped away, one more pod would have looked free and
    been left unschedulable."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4))
    assert _placed(capacity, "wide", 3, 3) == {"a": {"cpu": D(3), "pods": D(1)},
                                               "b": {"cpu": D(3), "pods": D(1)}}
    _bind(capacity, "wide", 0, "a", 3)
    _bind(capacity, "wide", 1, "b", 3)
    assert list(_placed(capacity, "small-0", 1)) == ["a"]  # a tie: by name
    assert list(_placed(capacity, "small-1", 1)) == ["b"]
    _bind(capacity, "small-0", 0, "b", 1)  # not where planned
    assert capacity.free()["cpu"] == 0
    assert capacity.pack([{"cpu": D(1)}]) == (
        "no Node has room for a pod of 1 cpu (most free on one Node: 0)")


def _wide_and_two_small():
    """Two 4-cpu Nodes, a wide job (3 + 3 cpu) and two 1-cpu jobs planned around it."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4))
    _placed(capacity, "wide", 3, 3)
    _placed(capacity, "small-0", 1)
    # Reserved as packing alone would: placing it now waits for the others' pods
    # (test_a_job_waits_while_pods_in_flight_could_strand_one), but a dispatcher that
    # restarted, or one before that check, holds it so.
    capacity.reserve(("team-a", "small-1"), {"cpu": D(1)}, pods=1,
                     planned={"b": {"cpu": D(1), "pods": D(1)}})
    return capacity


def test_planned_pods_that_lost_their_node_are_packed_where_the_scheduler_will_put_them():
    capacity = _wide_and_two_small()
    for index, name in enumerate("ab"):
        _bind(capacity, "wide", index, name, 3)
    _bind(capacity, "small-0", 0, "b", 1)
    # A 2-cpu Node joins: the scheduler will put small-1 there (it leaves more free than
    # a), so a 2-cpu pod fits nowhere, though a and the new Node have 3 free between them.
    add_nodes(capacity, node("c", cpu=2))
    assert capacity.free()["cpu"] == 2
    assert capacity.pack([{"cpu": D(2)}]).startswith("no Node has room for a pod of 2 cpu")
    assert list(capacity.pack([{"cpu": D(1)}])) == ["a"]


def test_a_job_bound_off_its_plan_holds_its_planned_room_until_its_last_pod_binds():
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4), node("c", cpu=8))
    capacity.reserve(("team-a", "wide"), {"cpu": D(6)}, pods=2,
                     planned={"a": {"cpu": D(3), "pods": D(1)}, "b": {"cpu": D(3), "pods": D(1)}})
    _bind(capacity, "wide", 0, "c", 3)
    # Which planned pod that was is not known: both stay held (never less than is due).
    assert capacity.free()["cpu"] == 16 - 3 - 6
    assert capacity.summary()["reserved"] == {"cpu": "3", "pods": "1"}
    _bind(capacity, "wide", 1, "a", 3)
    assert capacity.free()["cpu"] == 16 - 6


def test_planned_pods_of_different_shapes_move_together_when_their_node_fills_up():
    """A job's pods held on one Node, its trainer alone asking for the GPU: when the Node
    fills up otherwise, they move as one lump, GPU and all (an even split between them
    would count less GPU than the trainer needs)."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4, gpu=1), node("b", cpu=4, gpu=1))
    capacity.reserve(("team-a", "trainer"), {"cpu": D(2), GPU: D(1)}, pods=2,
                     planned={"a": {"cpu": D(2), GPU: D(1), "pods": D(2)}})
    capacity.on_pod(ADDED, None, pod("other", node_name="a", cpu="3"))
    assert capacity.free()[GPU] == 1
    # The held pods now need b's GPU. A GPU pod made before them would go to b (the
    # scheduler sees it emptier) and leave them none: refused.
    assert capacity.pack([{"cpu": D(1), GPU: D(1)}]) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod "
        "of 2 cpu and 1 nvidia.com/gpu together")
    assert list(capacity.pack([{"cpu": D(1)}])) == ["b"]  # beside them: more left there


def test_no_pod_is_placed_when_placed_jobs_pods_already_lack_room():
    capacity = _wide_and_two_small()
    # Both small jobs bound on b: the wide job's second pod has no Node left.
    _bind(capacity, "small-0", 0, "b", 1)
    _bind(capacity, "small-1", 0, "b", 1)
    assert capacity.pack([{"cpu": D(1)}]) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod of "
        "3 cpu (most free on one Node: 2)")


def test_a_job_whose_pods_could_come_first_must_leave_the_held_pods_room():
    """Two jobs placed a moment apart on two 8-cpu Nodes: 8 cpu for the first, 4 for the
    second. Planned in that order they fit; but the scheduler does not see the first's
    hold, and if the second's pod comes first it goes to the emptier-looking Node, the
    first's, and its initializer beside it on the other: the 8-cpu pod then fits nowhere.
    The second job waits until the first's pods are bound."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    initializer = {"cpu": D("0.1")}
    first = capacity.pack([{"cpu": D(8)}, initializer])
    assert first == {"a": {"cpu": D(8), "pods": D(1)}, "b": {"cpu": D("0.1"), "pods": D(1)}}
    capacity.reserve(("team-a", "first"), {"cpu": D("8.1")}, pods=2, planned=first)
    assert capacity.pack([{"cpu": D(4)}, initializer]) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod "
        "of 8 cpu (most free on one Node: 7.8)")
    _bind(capacity, "first", 0, "a", 8)
    assert list(capacity.pack([{"cpu": D(4)}, initializer])) == ["b"]


def test_a_job_waits_while_pods_in_flight_could_strand_one():
    """Two 4-cpu Nodes, a wide job (3 + 3 cpu) and two 1-cpu jobs: every packing order
    fits, but a small pod, then one wide pod, then the other small pod (each to the Node
    the scheduler sees emptier) leave the second wide pod 2 cpu on each Node. The second
    small job waits until the wide job's pods are bound, whichever came first."""
    for first, then in ((("wide", 3, 3), ("small-0", 1)), (("small-0", 1), ("wide", 3, 3))):
        capacity = WorkerCapacity()
        add_nodes(capacity, node("a", cpu=4), node("b", cpu=4))
        _placed(capacity, *first)
        _placed(capacity, *then)
        refused = capacity.pack([{"cpu": D(1)}])
        assert refused == (
            "pods of jobs placed here moments ago are not bound yet: in some order of "
            "arrival, theirs and this job's could leave a pod of 3 cpu without a Node (it "
            "waits for them to bind)"), (first, then)
        _bind(capacity, "wide", 0, "a", 3)
        # One wide pod still in flight: two small pods on b would still strand it.
        assert capacity.pack([{"cpu": D(1)}]).startswith("pods of jobs placed here")
        _bind(capacity, "wide", 1, "b", 3)
        assert not isinstance(capacity.pack([{"cpu": D(1)}]), str)


def test_pods_in_flight_with_room_to_spare_make_nothing_wait(monkeypatch):
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=8), node("b", cpu=8))
    _placed(capacity, "wide", 3, 3)
    _placed(capacity, "small-0", 1)

    def search(*args):
        raise AssertionError("a Node with room for every pending pod settles it unsearched")
    monkeypatch.setattr(arrival, "stranded", search)
    assert list(capacity.pack([{"cpu": D(1)}])) == ["b"]


def test_a_job_that_could_strand_only_its_own_pod_is_placed_all_the_same():
    """Pods of 3 and 2 cpu on Nodes of 3 and 2: if the 2 comes first, the scheduler may
    put it on the 3-cpu Node and leave the 3 nowhere. Waiting would not change that, so
    the job goes (packing puts each where it fits)."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=3), node("b", cpu=2))
    assert capacity.pack([{"cpu": D(3)}, {"cpu": D(2)}]) == {
        "a": {"cpu": D(3), "pods": D(1)}, "b": {"cpu": D(2), "pods": D(1)}}


def test_held_pods_are_checked_on_every_node_their_rules_admit():
    """A job held on Node a with nothing to stop it using b: a small job that could take
    a leaves it b, so nothing waits. The same job kept to a by its nodeSelector would be
    stranded there: the small job waits."""
    for selector, waits in ((None, False), ({"zone": "a"}, True)):
        capacity = WorkerCapacity()
        add_nodes(capacity, node("a", cpu=4, labels={"zone": "a"}), node("b", cpu=4))
        plan = capacity.pack([{"cpu": D(4)}], node_selector=selector)
        assert list(plan) == ["a"]
        capacity.reserve(("team-a", "held"), {"cpu": D(4)}, pods=1, planned=plan,
                         rules=(selector, None))
        answer = capacity.pack([{"cpu": D(1)}])
        assert isinstance(answer, str) is waits, (selector, answer)


def test_pods_in_flight_stop_making_jobs_wait_after_the_arrival_window():
    """A job placed a while ago whose pods never bound (its copy held back on the worker,
    a scheduler down) holds its room for packing, but no longer makes other jobs wait on
    the order of arrival: that wait ends."""
    now = [1000.0]
    capacity = WorkerCapacity(clock=lambda: now[0])
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4))
    _placed(capacity, "wide", 3, 3)
    _placed(capacity, "small-0", 1)
    now[0] += ARRIVAL_WINDOW_SECONDS
    assert capacity.pack([{"cpu": D(1)}]).startswith("pods of jobs placed here")
    assert not capacity.window_passed()
    now[0] += 1
    assert list(capacity.pack([{"cpu": D(1)}])) == ["b"]
    assert capacity.free()["cpu"] == 8 - 7  # their room still held
    # What tells the dispatcher to look at waiting jobs again, once per passing.
    assert capacity.window_passed()
    assert not capacity.window_passed()


def test_a_succeeded_pod_keeps_covering_its_part_of_the_reservation():
    """An initializer (1 cpu) planned on a, the trainer (8 cpu) on c. Once the initializer
    has succeeded and the trainer is bound, nothing of the job is in flight: its room on a
    is free, and a job of 3 + 3 + 1 cpu is placed without waiting. A failed pod is
    different: its replacement needs the room again."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4), node("c", cpu=8))
    plan = _placed(capacity, "tuned", 8, 1)
    assert plan == {"c": {"cpu": D(8), "pods": D(1)}, "a": {"cpu": D(1), "pods": D(1)}}
    initializer = pod("tuned-initializer-0", node_name="a", cpu="1", job="tuned")
    capacity.on_pod(ADDED, None, initializer)
    _bind(capacity, "tuned", 0, "c", 8)
    done = copy.deepcopy(initializer)
    done["status"]["phase"] = "Succeeded"
    capacity.on_pod(MODIFIED, initializer, done)
    assert capacity.free()["cpu"] == 16 - 8
    assert not isinstance(capacity.pack([{"cpu": D(3)}, {"cpu": D(3)}, {"cpu": D(1)}]), str)
    failed = copy.deepcopy(initializer)
    failed["status"]["phase"] = "Failed"
    capacity.on_pod(MODIFIED, done, failed)
    assert capacity.free()["cpu"] == 16 - 9


def test_a_cordoned_node_does_not_take_the_pods_in_flight():
    """A job kept to zone z, planned on c (16 cpu), is left with d (3 cpu) once c is
    cordoned. A 1-cpu pod that lands on d first strands it, however much room a has: the
    new job waits, as it would with c gone."""
    zone = {"zone": "z"}
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=100), node("c", cpu=16, labels=zone),
              node("d", cpu=3, labels=zone))
    plan = capacity.pack([{"cpu": D(3)}], node_selector=zone)
    assert list(plan) == ["c"]
    capacity.reserve(("team-a", "zoned"), {"cpu": D(3)}, pods=1, planned=plan,
                     rules=(zone, None))
    capacity.on_node(MODIFIED, node("c", cpu=16, labels=zone),
                     node("c", cpu=16, labels=zone, unschedulable=True))
    assert capacity.pack([{"cpu": D(1)}]) == (
        "pods of jobs placed here moments ago are not bound yet: in some order of arrival, "
        "theirs and this job's could leave a pod of 3 cpu without a Node (it waits for "
        "them to bind)")


def test_held_pods_are_packed_again_only_where_their_rules_admit():
    """A job kept to zone z held on c (8 cpu). A 6-cpu pod that comes first goes to c (the
    scheduler sees it emptier than a's 7) and leaves 2: the held pod may not move to a, so
    the new job is refused rather than counted on a room that job cannot use."""
    zone = {"zone": "z"}
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=7), node("c", cpu=8, labels=zone))
    plan = capacity.pack([{"cpu": D(3)}], node_selector=zone)
    capacity.reserve(("team-a", "zoned"), {"cpu": D(3)}, pods=1, planned=plan,
                     rules=(zone, None))
    assert capacity.pack([{"cpu": D(6)}]) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod "
        "of 3 cpu (most free on one Node: 2)")


def test_held_pods_are_asked_about_as_they_were_packed():
    """A bin-packing worker: a trainer of 3 cpu and an initializer of 1 held together on
    a. A 2-cpu pod arriving first may go to a and leave the trainer no Node: the job
    waits. Asked about as two pods of 2 cpu (an even split of what is held on a), nothing
    would have been seen: they fit around it."""
    capacity = WorkerCapacity(scoring=MOST_ALLOCATED)
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=2), node("c", cpu=2))
    plan = _placed(capacity, "tuned", 3, 1)
    assert plan.pods == {"a": [{"cpu": D(3), "pods": D(1)}, {"cpu": D(1), "pods": D(1)}]}
    assert capacity.pack([{"cpu": D(2)}]).startswith("pods of jobs placed here")


def test_a_search_that_cannot_tell_lets_packing_stand(monkeypatch):
    """Where the search runs out of budget before it knows whether the held pods alone
    could strand one, the job does not wait (as when they could)."""
    capacity = WorkerCapacity()
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4))
    _placed(capacity, "wide", 3, 3)
    _placed(capacity, "small-0", 1)
    real = arrival.stranded
    answers = iter([real, real, lambda *args: arrival.UNKNOWN])
    monkeypatch.setattr(arrival, "stranded", lambda *args: next(answers)(*args))
    assert list(capacity.pack([{"cpu": D(1)}])) == ["b"]


def test_held_pods_moved_off_a_short_node_find_no_room_held_for_others():
    """A Node that looks empty to the scheduler is full of another job's held room: the
    held pods of a Node made short elsewhere cannot move there, so the next job waits
    (bin-packing: the next job's pod would go to the short Node, leaving the other as
    it was)."""
    capacity = WorkerCapacity(scoring=MOST_ALLOCATED)
    add_nodes(capacity, node("a", cpu=4), node("b", cpu=4), node("c", cpu=1))
    capacity.reserve(("team-a", "one"), {"cpu": D(3)}, pods=1,
                     planned={"a": {"cpu": D(3), "pods": D(1)}})
    capacity.reserve(("team-a", "two"), {"cpu": D(3)}, pods=1,
                     planned={"b": {"cpu": D(3), "pods": D(1)}})
    assert list(capacity.pack([{"cpu": D("0.5")}])) == ["a"]
    capacity.on_pod(ADDED, None, pod("other", node_name="a", cpu="2"))
    # One's 3 cpu no longer fit on a (2 left); b has 4 free as bound pods go, but 1 as
    # two's are held: refused.
    assert capacity.pack([{"cpu": D("0.5")}]) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod of "
        "3 cpu (most free on one Node: 2)")


def test_a_handler_does_not_wait_for_a_decision_in_progress():
    """While a decision holds the picture (here: the test holds its lock as a long packing
    would), Pod and Node events and the copies' reservations return at once; the next
    reader takes them in, in order."""
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a", cpu=10))
    returned = threading.Event()

    def events():
        capacity.on_pod(ADDED, None, pod("p1", node_name="a", cpu="3", job="j1"))
        capacity.reserve(("team-a", "j2"), {"cpu": D(2)}, pods=1)
        assert capacity.reserved(("team-a", "j2"))
        assert capacity.release(("team-a", "j2")) is True
        capacity.reserve(("team-a", "j3"), {"cpu": D(1)}, pods=1)
        returned.set()

    with capacity._lock:  # a decision in progress
        thread = threading.Thread(target=events)
        thread.start()
        assert returned.wait(10), "an informer handler waited for the decision's lock"
    thread.join()
    assert capacity.free()["cpu"] == 6  # 10 - 3 bound - 1 held for j3
    capacity.check()


def test_check_finds_a_kept_sum_that_drifted():
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a", cpu=10))
    capacity.on_pod(ADDED, None, pod("p1", node_name="a", cpu="3", job="j1"))
    capacity.free()
    capacity.check()
    capacity._used["a"]["cpu"] = D(2)  # a bookkeeping bug, as check must catch it
    with pytest.raises(AssertionError, match="used per Node"):
        capacity.check()


def test_a_pod_change_during_a_decision_is_counted_at_once_and_the_decision_keeps_its_picture(
        monkeypatch):
    """A handler never waits for a decision: its change is counted in the index before it
    returns (``pod_event_applied`` told once, while the decision still holds the picture),
    the held decision's picture does not change under it, and the next reader sees it."""
    applied: list[float] = []
    monkeypatch.setattr(WorkerCapacity, "pod_event_applied", applied.append)
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a"))
    with capacity._picture():  # a decision holding the picture
        before = (copy.deepcopy(capacity._used), dict(capacity._room("a", False)))
        handler = threading.Thread(target=capacity.on_pod, args=(
            ADDED, None, pod("p1", node_name="a", cpu="3")))
        handler.start()
        handler.join(timeout=10)
        assert not handler.is_alive(), "the Pod handler waited for the decision"
        assert len(applied) == 1, f"while the decision runs: {len(applied)} changes counted, not 1"
        assert (capacity._used, capacity._room("a", False)) == before, \
            "the held decision's picture changed under it"
    assert len(applied) == 1, f"after the decision: {len(applied)} changes counted, not 1"
    assert capacity.free()["cpu"] == D(5)
    capacity.check()


def test_pod_events_are_counted_while_a_packing_runs_which_decides_on_its_own_picture(
        monkeypatch):
    """A real decision (``pack``) paused inside the packing: Pod events that come meanwhile
    return and are counted (applied told for each) before it ends, and it decides on the
    picture it took (the 4 cpu still fit there); the next decision sees them."""
    from dispatcher.room import packing

    applied: list[float] = []
    monkeypatch.setattr(WorkerCapacity, "pod_event_applied", applied.append)
    capacity = WorkerCapacity("w")
    add_nodes(capacity, node("a", cpu=8))
    packing_started, go_on = threading.Event(), threading.Event()
    decide = packing.decide

    def paused(wanted, snapshot):
        packing_started.set()
        assert go_on.wait(10), "the test never let the packing go on"
        return decide(wanted, snapshot)

    monkeypatch.setattr(packing, "decide", paused)
    answers: list = []
    decision = threading.Thread(target=lambda: answers.append(
        capacity.pack([{"cpu": D(4), "pods": D(1)}])))
    decision.start()
    try:
        assert packing_started.wait(10), "the decision never reached the packing"
        for index in range(3):
            assert capacity.on_pod(ADDED, None, pod(f"p{index}", node_name="a", cpu="2")), \
                f"p{index}: not counted as a change"
        assert len(applied) == 3 and decision.is_alive(), (
            f"{len(applied)} of 3 Pod changes counted before the decision ended "
            f"(decision running: {decision.is_alive()})")
    finally:
        go_on.set()
        decision.join(10)
    assert [list(answer) for answer in answers] == [["a"]], \
        f"the decision's answer on the picture it took: {answers}"
    monkeypatch.setattr(packing, "decide", decide)
    assert capacity.free()["cpu"] == D(2)
    assert isinstance(capacity.pack([{"cpu": D(4), "pods": D(1)}]), str)
    capacity.check()


def test_concurrent_handlers_and_decisions_keep_the_index_and_the_picture_exact():
    """Threads send Pod and Node events and reserve and release on three Nodes while two
    others decide (``pack``, ``free``) and check: every check passes, and at the end the
    totals are those of a capacity fed the final Nodes, pods and reservations from
    scratch."""
    names = ["a", "b", "c"]
    capacity = WorkerCapacity("w")
    add_nodes(capacity, *(node(name, cpu=64) for name in names))
    errors: list[str] = []
    final_pods: dict[str, dict] = {}
    final_nodes: dict[str, dict] = {}
    churning = threading.Event()

    def churn(prefix, where):
        job = ("team-a", prefix)
        for i in range(60):
            p = pod(f"{prefix}-{i % 4}", node_name=names[(i + where) % 3], cpu="1", job=prefix,
                    phase="Succeeded" if i % 7 == 0 else "Running")
            capacity.on_pod(MODIFIED, None, p)
            if i % 5 == 0:
                capacity.reserve(job, {"cpu": D(2)}, pods=2,
                                 planned={names[i % 3]: {"cpu": D(2), "pods": D(2)}})
            if i % 11 == 0:
                capacity.release(job)
            if i % 13 == 0:
                capacity.on_pod(DELETED, p, None)
                final_pods.pop(p["metadata"]["name"], None)
            else:
                final_pods[p["metadata"]["name"]] = p
        capacity.reserve(job, {"cpu": D(3)}, pods=1)  # the last word: a reservation

    def relabel():
        for i in range(30):
            name = names[i % 3]
            n = node(name, cpu=64, labels={"pool": "ab"[i % 2]}, ready=i % 4 != 3)
            capacity.on_node(MODIFIED, None, n)
            final_nodes[name] = n

    def decide():
        steps = 0
        while churning.is_set() or steps < 5:
            steps += 1
            try:
                capacity.pack([{"cpu": D(2), "pods": D(1)}] * 2)
                capacity.free({"pool": "a"})
                capacity.check()
            except AssertionError as err:
                errors.append(f"decision {steps}: {err}")

    senders = [threading.Thread(target=churn, args=(f"t{n}", n)) for n in range(4)]
    senders.append(threading.Thread(target=relabel))
    run_alongside(senders, [threading.Thread(target=decide) for _ in range(2)], churning)
    assert errors == []
    capacity.check()
    fresh = WorkerCapacity("fresh")
    add_nodes(fresh, *(final_nodes.get(name) or node(name, cpu=64) for name in names))
    for p in final_pods.values():
        fresh.on_pod(ADDED, None, p)
    for n in range(4):
        fresh.reserve(("team-a", f"t{n}"), {"cpu": D(3)}, pods=1)
    assert capacity.summary() == fresh.summary()
