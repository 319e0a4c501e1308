"""What keeps placement fast on large workers gives the answers the plain computation
gives: the room kept per Node and summed per rule set, the Nodes scored once per pod shape,
and the Nodes and Pods cached as projections (pure)."""

from __future__ import annotations

import copy
import random
from decimal import Decimal as D

from test_capacity import GPU, node, pod

from dispatcher.room import capacity as capacity_module
from dispatcher.room import packing as packing_module
from dispatcher.room.amounts import fits, shift
from dispatcher.room.capacity import (
    _SCORED,
    _ZERO,
    PODS,
    Resources,
    WorkerCapacity,
    admits,
    pod_requests,
)
from dispatcher.workers import projections
from trainjob.constants import JOBSET_NAME_LABEL

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
RULES = [(None, None), ({"pool": "gpu"}, TOLERATE_GPU), ({"zone": "a"}, None)]


# The plain reference the packers are held to: every Node scored for every pod, exactly.

def _take(room: dict[str, Resources], allocatable: dict[str, Resources], wanted: Resources,
          sign: int) -> str | None:
    """The Node the scheduler scores best for a pod among those with room for it (highest
    score first; the scheduler breaks ties at random, this by name), where the pod then
    takes its room; None when it fits nowhere."""
    fitting = [name for name, free in room.items() if fits(free, wanted)]
    if not fitting:
        return None
    # Scoring only ranks: a pod with one Node to go to goes there.
    best = fitting[0] if len(fitting) == 1 else min(
        fitting, key=lambda n: (-sign * _free_share(room[n], allocatable[n], wanted), n))
    shift(room[best], wanted, -1)
    return best


def _free_share(free: Resources, allocatable: Resources, wanted: Resources) -> D:
    """The scheduler's resource score of a Node for a pod, as a share: the mean over cpu
    and memory of what stays free after the pod, over what the Node allocates (high:
    LeastAllocated picks it; low: MostAllocated does)."""
    total, count = _ZERO, 0
    for resource, default in _SCORED:
        allocated = allocatable.get(resource, _ZERO)
        if allocated > 0:
            total += (free.get(resource, _ZERO) - (wanted.get(resource) or default)) / allocated
            count += 1
    return total / count if count else _ZERO


def fleet(count: int) -> list[dict]:
    """Nodes of three sizes in two zones; every fifth a tainted GPU Node."""
    nodes = []
    for index in range(count):
        if index % 5 == 0:
            nodes.append(node(f"n{index}", cpu=96, memory="1Ti", gpu=8,
                              labels={"pool": "gpu", "zone": "ab"[index % 2]},
                              taints=[{"key": GPU, "value": "present",
                                       "effect": "NoSchedule"}]))
        else:
            nodes.append(node(f"n{index}", cpu=(32, 64)[index % 2], memory="256Gi",
                              labels={"pool": "cpu", "zone": "ab"[index % 2]}))
    return nodes


def plain_free(capacity: WorkerCapacity, selector, tolerations) -> dict:
    """``free`` worked out from the bound pods and plans alone, nothing kept."""
    total: dict = {}
    for name, each in capacity._nodes.items():
        if not each.usable or not admits(each.labels, each.taints, selector, tolerations):
            continue
        used = capacity._used.get(name, {})
        planned = capacity._node_planned.get(name, {})
        for resource, allocated in each.allocatable.items():
            total[resource] = (total.get(resource, D(0))
                               + max(allocated - used.get(resource, D(0)), D(0))
                               - planned.get(resource, D(0)))
    for resource, amount in capacity._unplanned_total.items():
        if resource in total:
            total[resource] -= amount
    return {resource: max(amount, D(0)) for resource, amount in total.items()}


def test_free_room_kept_per_node_matches_the_plain_sum_through_random_changes():
    rng = random.Random(7)
    capacity = WorkerCapacity("w")
    nodes = fleet(40)
    for each in nodes:
        capacity.on_node(ADDED, None, each)
    pods: dict[str, dict] = {}
    for step in range(600):
        action = rng.random()
        if action < 0.45 or not pods:
            target = rng.choice(nodes)["metadata"]["name"]
            name = f"p{step}"
            pods[name] = pod(name, node_name=target, cpu=str(rng.choice((1, 2, 4))),
                             memory="1Gi", job=f"job-{rng.randrange(20)}")
            capacity.on_pod(ADDED, None, pods[name])
        elif action < 0.7:
            name = rng.choice(sorted(pods))
            capacity.on_pod(DELETED, pods.pop(name), None)
        elif action < 0.8:
            name = rng.choice(sorted(pods))
            done = copy.deepcopy(pods[name])
            done["status"]["phase"] = "Succeeded"
            capacity.on_pod(MODIFIED, pods[name], done)
            pods[name] = done
        elif action < 0.9:
            job = ("team-a", f"job-{rng.randrange(20)}")
            selector, tolerations = rng.choice(RULES)
            each = {"cpu": D(2), "memory": D(2**30)}
            plan = capacity.pack([each, each], selector, tolerations)
            if not isinstance(plan, str):
                capacity.reserve(job, {"cpu": D(4), "memory": D(2**31)}, 2, plan,
                                 (selector, tolerations))
        else:
            capacity.release(("team-a", f"job-{rng.randrange(20)}"))
        if step % 10 == 0:
            # Cordon or uncordon a Node now and then: the rule sets' members change.
            changed = copy.deepcopy(rng.choice(nodes))
            changed["spec"]["unschedulable"] = rng.random() < 0.5
            capacity.on_node(MODIFIED, None, changed)
        for selector, tolerations in RULES:
            kept = capacity.free(selector, tolerations)
            assert kept == plain_free(capacity, selector, tolerations), (
                f"step {step}: free room kept for {selector} differs from the plain sum")


def test_nodes_scored_once_per_pod_shape_go_where_scoring_every_node_sends_them():
    rng = random.Random(11)
    nodes = {f"n{i}": {"cpu": D(rng.choice((8, 16, 32))), "memory": D(2**30 * 64),
                       PODS: D(110)} for i in range(60)}
    for sign in (1, -1):
        pods = sorted(([{"cpu": D(rng.choice((1, 2, 3))), "memory": D(2**30), PODS: D(1)}
                        for _ in range(80)]), key=lambda r: sorted(r.items()), reverse=True)
        one_by_one = {name: dict(room) for name, room in nodes.items()}
        rooms = copy.deepcopy(nodes)
        packer = capacity_module._Packer(capacity_module._Rooms(rooms, rooms.__getitem__),
                                         nodes, sign)
        for each in pods:
            expected = _take(one_by_one, nodes, each, sign)
            assert packer.take(each) == expected, f"pod {each} (sign {sign})"
        assert {name: packer.room[name] for name in nodes} == one_by_one


def test_heaps_kept_between_placements_pack_as_heaps_made_afresh():
    """Two workers alike; one keeps its scored Nodes, and which Nodes hold more room than
    they have left, between placements; the other is made to work both out afresh at each.
    Through pods coming and going (some bound off their job's plan), plans held and
    released, Nodes cordoned, and shapes alternating, both pack every job the same (and the
    count of held pods that spares listing them never says more than the list holds)."""
    rng = random.Random(13)
    kept, fresh = WorkerCapacity("kept"), WorkerCapacity("fresh")
    nodes = fleet(30)
    for capacity in (kept, fresh):
        for each in nodes:
            capacity.on_node(ADDED, None, each)
    shapes = [({"cpu": D(2), "memory": D(2**31)}, 3), ({"cpu": D(8), "memory": D(2**33)}, 5),
              ({"cpu": D(1), "memory": D(2**30)}, 1)]
    pods: dict[str, dict] = {}
    served = 0  # placements that found heaps kept from earlier ones
    short = 0  # placements with held room to move off a Node short of it
    for step in range(400):
        action = rng.random()
        if action < 0.3 or not pods:
            name = f"p{step}"
            pods[name] = pod(name, node_name=rng.choice(nodes)["metadata"]["name"],
                             cpu=str(rng.choice((1, 2, 4, 32))), memory="1Gi",
                             job=f"job-{rng.randrange(10)}")
            events = [(ADDED, None, pods[name])]
        elif action < 0.45:
            name = rng.choice(sorted(pods))
            events = [(DELETED, pods.pop(name), None)]
        elif action < 0.5:
            changed = copy.deepcopy(rng.choice(nodes))
            changed["spec"]["unschedulable"] = rng.random() < 0.3
            gone_and_back = rng.random() < 0.3
            for capacity in (kept, fresh):
                if gone_and_back:
                    capacity.on_node(DELETED, changed, None)
                capacity.on_node(MODIFIED, None, changed)
            events = []
        elif action < 0.6:
            job = ("team-a", f"job-{rng.randrange(10)}")
            assert kept.release(job) == fresh.release(job)
            events = []
        else:
            shape, count = rng.choice(shapes)
            selector, tolerations = rng.choice(RULES)
            fresh.drop_caches()
            served += bool(kept._heaps)
            short += bool(fresh._short_nodes())
            # What the check of arrival orders counts before it lists the held pods.
            held = list(kept._counted)
            assert kept._held_pods_at_least(held) <= len(kept._held_pods(held)), step
            plans = [capacity.pack([shape] * count, selector, tolerations)
                     for capacity in (kept, fresh)]
            assert plans[0] == plans[1], f"step {step}: {shape} x {count} packed apart"
            if not isinstance(plans[0], str):
                assert plans[0].pods == plans[1].pods, f"step {step}: pods packed apart"
                job = ("team-a", f"job-{rng.randrange(10)}")
                total = {r: a * count for r, a in shape.items()}
                for capacity, plan in zip((kept, fresh), plans, strict=True):
                    capacity.reserve(job, total, count, plan, (selector, tolerations))
            events = []
        for capacity in (kept, fresh):
            for event in events:
                capacity.on_pod(*event)
        if step % 10 == 0:
            kept.check()  # every kept sum and cache as worked out afresh
    assert served > 50, f"heaps were kept for only {served} placements"
    assert short > 10, f"only {short} placements met a Node short of its held room"


def test_a_changed_node_costs_its_own_rescoring_not_every_nodes(monkeypatch):
    """The heaps and sums a placement reads are brought up to date from the Nodes changed
    since the last one (their generations): a Node cordoned and another taking a pod cost
    the next placement a few scores, not a score of every Node; and it packs as a worker
    working everything out afresh does."""
    kept, fresh = WorkerCapacity("kept"), WorkerCapacity("fresh")
    nodes = fleet(200)  # 160 untainted Nodes admit a plain pod
    for capacity in (kept, fresh):
        for each in nodes:
            capacity.on_node(ADDED, None, each)
    scores = []
    real_rank = packing_module.rank
    # Every score counts: the heap cache's (capacity) and the packer's own (packing).
    for module, name in ((capacity_module, "_rank"), (packing_module, "rank")):
        monkeypatch.setattr(module, name, lambda *args: scores.append(1) or real_rank(*args))
    shape = {"cpu": D(2), "memory": D(2**31)}
    kept.free()
    kept.pack([shape] * 4)
    first = len(scores)
    cordoned = copy.deepcopy(nodes[1])
    cordoned["spec"]["unschedulable"] = True
    for capacity in (kept, fresh):
        capacity.on_node(MODIFIED, None, cordoned)
        capacity.on_pod(ADDED, None, pod("p", node_name="n2", cpu="30", memory="1Gi"))
    scores.clear()
    kept_free, plan = kept.free(), kept.pack([shape] * 4)
    assert first >= 160 and len(scores) <= 12, \
        f"Nodes scored: {first} for the first placement, {len(scores)} for the next"
    fresh.drop_caches()
    assert (kept_free, plan, plan.pods) == (fresh.free(), (again := fresh.pack([shape] * 4)),
                                           again.pods)
    assert "n1" not in plan
    kept.check()


def test_a_node_heartbeat_and_a_pods_status_change_leave_the_room_alone():
    capacity = WorkerCapacity("w")
    first = node("a", cpu=8)
    assert capacity.on_node(ADDED, None, first) is True
    beat = copy.deepcopy(first)
    beat["metadata"]["resourceVersion"] = "2"
    assert capacity.on_node(MODIFIED, first, beat) is False, "a heartbeat changed the room"
    running = pod("p", node_name="a", cpu="2", job="j")
    assert capacity.on_pod(ADDED, None, running) is True
    ready = copy.deepcopy(running)
    ready["metadata"]["resourceVersion"] = "9"
    assert capacity.on_pod(MODIFIED, running, ready) is False
    unbound = pod("q", cpu="2")
    assert capacity.on_pod(DELETED, unbound, None) is False, "an unbound pod held no room"
    assert capacity.on_pod(DELETED, ready, None) is True


def real_pod() -> dict:
    """A Pod as an apiserver returns it: volumes, status, conditions, owner."""
    return {
        "metadata": {"name": "p", "namespace": "team", "resourceVersion": "7", "uid": "u",
                     "labels": {JOBSET_NAME_LABEL: "js", "app": "x"},
                     "annotations": {"a": "b" * 200},
                     "ownerReferences": [{"kind": "Job", "name": "j", "uid": "u"}]},
        "spec": {"nodeName": "n1", "overhead": {"cpu": "250m"},
                 "containers": [{"name": "main", "image": "i", "command": ["c"] * 5,
                                 "resources": {"limits": {GPU: "1", "cpu": "2"}},
                                 "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                 "initContainers": [
                     {"name": "side", "restartPolicy": "Always",
                      "resources": {"requests": {"cpu": "1"}}},
                     {"name": "init", "resources": {"requests": {"memory": "8Gi"}}}],
                 "volumes": [{"name": "v", "projected": {"sources": []}}],
                 "tolerations": [{"key": "k", "operator": "Exists"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_projected_pod_counts_for_what_the_whole_pod_counts_for():
    whole = real_pod()
    kept = projections.pod(copy.deepcopy(whole))
    assert pod_requests(kept) == pod_requests(whole)
    assert kept["spec"]["nodeName"] == "n1" and kept["status"] == {"phase": "Running"}
    assert kept["metadata"]["labels"] == {JOBSET_NAME_LABEL: "js"}
    assert "volumes" not in kept["spec"] and "annotations" not in kept["metadata"]
    full, lean = WorkerCapacity("full"), WorkerCapacity("lean")
    for capacity, each in ((full, whole), (lean, kept)):
        capacity.on_node(ADDED, None, node("n1", cpu=16, memory="64Gi", gpu=4))
        capacity.on_pod(ADDED, None, each)
    assert full.summary() == lean.summary()


def test_a_projected_node_is_placed_on_as_the_whole_node_is():
    whole = fleet(1)[0]
    whole["status"]["conditions"].append({"type": "MemoryPressure", "status": "False"})
    whole["status"]["nodeInfo"] = {"kubeletVersion": "v1.34.0"}
    kept = projections.node(copy.deepcopy(whole))
    assert kept["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert "nodeInfo" not in kept["status"]
    full, lean = WorkerCapacity("full"), WorkerCapacity("lean")
    full.on_node(ADDED, None, whole)
    lean.on_node(ADDED, None, kept)
    for selector, tolerations in RULES:
        assert full.free(selector, tolerations) == lean.free(selector, tolerations)


def test_packers_sharing_nodes_each_see_the_others_take_room():
    """Held pods of jobs with different rules are packed over Nodes two rule sets share:
    what one packer takes, the other scores afresh (under either scoring)."""
    rng = random.Random(5)
    nodes = {f"n{i}": {"cpu": D(rng.choice((8, 16))), "memory": D(2**30 * 32), PODS: D(110)}
             for i in range(30)}
    names = sorted(nodes)
    sets = [frozenset(names[:20]), frozenset(names[10:])]
    for sign in (1, -1):
        plain = {name: dict(room) for name, room in nodes.items()}
        kept = copy.deepcopy(nodes)
        rooms = capacity_module._Rooms(kept, kept.__getitem__)
        packers = [capacity_module._Packer(rooms, nodes, sign, allowed) for allowed in sets]
        for step in range(60):
            which = rng.randrange(2)
            each = {"cpu": D(rng.choice((1, 2))), "memory": D(2**30), PODS: D(1)}
            choices = {name: plain[name] for name in plain if name in sets[which]}
            expected = _take(choices, nodes, each, sign)
            assert packers[which].take(each) == expected, f"step {step} (sign {sign})"
        assert {name: rooms[name] for name in nodes} == plain
