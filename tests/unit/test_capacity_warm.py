"""Heaps warmed ahead of a decision (``WorkerCapacity.warm``): the first decision of a pod
shape then scores no more Nodes than a later one, decides as a worker without warming
does, a bounded number wait, a Node that changes while they are scored is scored again
by the decision, and a shape is scored by one caller at a time; the placer warms a job's
shapes on each worker as soon as it sees the job (pure)."""

from __future__ import annotations

import copy
import threading
from decimal import Decimal as D

import pytest
from test_capacity import node, pod
from test_capacity_at_scale import TOLERATE_GPU, fleet
from test_placer import job, runtime
from test_placer import worker as worker_cluster

from clusters.testing import eventually
from dispatcher.placement import placer as placer_module
from dispatcher.placement.placer import Placer
from dispatcher.room import capacity as capacity_module
from dispatcher.room import packing
from dispatcher.room.capacity import HEAPS_WARMED, WorkerCapacity

from worker_fakes import Registry

ADDED, MODIFIED = "ADDED", "MODIFIED"
SHAPE = {"cpu": D(4), "memory": D(2**33)}


def worker(name: str, nodes: list[dict]) -> WorkerCapacity:
    capacity = WorkerCapacity(name)
    for each in nodes:
        capacity.on_node(ADDED, None, each)
    return capacity


@pytest.fixture
def scorings(monkeypatch) -> list[int]:
    """Every Node scored, by the kept heaps (``capacity``) or by a packer (``packing``)."""
    counted = [0]

    def counting(real):
        def rank(*args):
            counted[0] += 1
            return real(*args)
        return rank

    monkeypatch.setattr(capacity_module, "_rank", counting(capacity_module._rank))
    monkeypatch.setattr(packing, "rank", counting(packing.rank))
    return counted


def test_the_first_decision_of_a_warmed_shape_scores_no_more_nodes_than_a_later_one(scorings):
    nodes = fleet(60)
    warmed, cold = worker("warmed", nodes), worker("cold", nodes)
    for capacity in (warmed, cold):
        # Room held on some Nodes: the decision packs in both orders, over both rooms.
        capacity.reserve(("team-a", "held"), {"cpu": D(8)}, 2,
                         capacity.pack([{"cpu": D(4)}] * 2))
    assert warmed.warm([SHAPE] * 3) == 2  # held room, and the room the scheduler sees
    assert warmed.warm([SHAPE] * 3) == 0  # already warm
    per_decision = []
    for capacity in (warmed, cold, warmed):
        scorings[0] = 0
        plan = capacity.pack([SHAPE] * 3)
        per_decision.append((sorted(plan.items()), scorings[0]))
        capacity.check()
    (first, first_scored), (unwarmed, cold_scored), (later, later_scored) = per_decision
    assert first == unwarmed == later, per_decision
    assert first_scored <= later_scored < len(nodes) <= cold_scored, per_decision


def test_warmed_heaps_are_bounded_the_least_recently_warmed_dropped(scorings):
    nodes = [node(f"n{index}", cpu=16) for index in range(30)]
    capacity = worker("w", nodes)
    shapes = [{"cpu": D(1 + index), "memory": D(2**30)} for index in range(HEAPS_WARMED + 3)]
    for shape in shapes:
        assert capacity.warm([shape]) == 1
    assert len(capacity._warmed) == HEAPS_WARMED
    kept = {dict(key[3])["cpu"] for key in capacity._warmed}
    assert kept == {shape["cpu"] for shape in shapes[3:]}, kept
    capacity.check()
    for shape, warm in ((shapes[0], False), (shapes[-1], True)):
        scorings[0] = 0
        capacity.pack([shape])
        assert (scorings[0] < len(nodes)) == warm, (shape, scorings[0])
    # The decision took the warmed heap in among those kept: it waits no longer.
    assert len(capacity._warmed) == HEAPS_WARMED - 1


def test_a_node_changed_while_warming_is_scored_again_by_the_decision(monkeypatch):
    nodes = fleet(40)
    warmed, plain = worker("warmed", nodes), worker("plain", nodes)
    rules = ({"pool": "gpu"}, TOLERATE_GPU)
    shape = {"cpu": D(8), "memory": D(2**34), "nvidia.com/gpu": D(1)}
    best = plain.pack([shape], *rules)
    assert len(best) == 1
    first = next(iter(best))
    second = next(iter(plain.pack([shape] * 2, *rules).keys() - {first}))
    plain.drop_caches()
    cordoned = copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == first))
    cordoned["spec"]["unschedulable"] = True
    filler = pod("filler", node_name=second, cpu="90", memory="1Gi", gpu="7")
    added = copy.deepcopy(cordoned)
    added["metadata"]["name"] = "n99"
    added["spec"].pop("unschedulable")
    added["status"]["allocatable"].update({"cpu": "192", "nvidia.com/gpu": "16"})

    def change(capacity: WorkerCapacity) -> None:
        capacity.on_node(MODIFIED, None, cordoned)
        capacity.on_pod(ADDED, None, filler)
        capacity.on_node(ADDED, None, added)  # the roomiest: where the pods go now

    # The changes come while ``warm`` scores, after it read the rooms and let the lock go.
    real_score = capacity_module._Kept.score
    armed = [True]

    def score(self, *args, **kwargs):
        if armed[0]:
            armed[0] = False
            change(warmed)
        return real_score(self, *args, **kwargs)

    monkeypatch.setattr(capacity_module._Kept, "score", score)
    assert warmed.warm([shape] * 2, *rules) == 1
    assert not armed[0], "the Node changed while warming"
    change(plain)
    plans = [capacity.pack([shape] * 2, *rules) for capacity in (warmed, plain)]
    assert plans[0] == plans[1], plans
    assert "n99" in plans[0] and not {first, second} & plans[0].keys(), plans[0]
    for capacity in (warmed, plain):
        capacity.check()


def test_warming_a_shape_a_decision_keeps_already_hands_nothing_in():
    capacity = worker("w", [node(f"n{index}") for index in range(5)])
    capacity.pack([SHAPE])
    assert capacity.warm([SHAPE]) == 0
    assert not capacity._warmed


def test_a_job_seen_is_warmed_ahead_on_each_worker_and_its_placement_takes_the_heaps(
        monkeypatch):
    builds = []
    real = placer_module.build_runtime_info
    monkeypatch.setattr(placer_module, "build_runtime_info",
                        lambda *args, **kwargs: builds.append(1) or real(*args, **kwargs))
    workers = [worker_cluster(f"worker-{index}", index, runtime(f"u{index}", "5", "2"))
               for index in (1, 2)]
    placer = Placer(Registry(*workers), "best-fit")
    placer.warm_ahead(job("a"))
    eventually(lambda: [len(each.capacity._warmed) for each in workers],
               lambda counts: counts == [1, 1],
               expected="one heap warmed on each worker for the job's one pod shape")
    assert builds == [1], "the need worked out once, ahead, for both workers"
    chosen, _ = placer.place(job("a"))
    assert builds == [1], "the placement found the need known"
    assert not chosen.capacity._warmed and len(chosen.capacity._heaps) == 1, \
        "the decision took the warmed heap in among those kept"
    chosen.capacity.check()


def test_a_shape_being_warmed_is_not_scored_twice(monkeypatch, scorings):
    capacity = worker("w", [node(f"n{index}") for index in range(20)])
    real_score = capacity_module._Kept.score
    meanwhile = []

    def score(self, *args, **kwargs):
        if not meanwhile:  # another caller asks for the shape while it is being scored
            before = scorings[0]
            meanwhile.append((capacity.warm([SHAPE], wait=0), scorings[0] - before))
        return real_score(self, *args, **kwargs)

    monkeypatch.setattr(capacity_module._Kept, "score", score)
    assert capacity.warm([SHAPE]) == 1
    assert meanwhile == [(0, 0)], meanwhile
    assert not capacity._warming


def test_a_caller_waiting_for_a_shape_being_warmed_holds_nothing(monkeypatch):
    """The placement that finds its shape being warmed waits without the picture, so the
    warming can hand its heap in (and the wait ends with it, not with its timeout)."""
    capacity = worker("w", [node(f"n{index}") for index in range(20)])
    real_score, real_wait = capacity_module._Kept.score, WorkerCapacity._wait_for
    waiting, ended = threading.Event(), []

    def wait_for(events, seconds):
        events = list(events)
        if not events:  # the first caller, nothing to wait for
            return
        waiting.set()
        real_wait(events, seconds)
        ended.append(all(event.is_set() for event in events))

    def score(self, *args, **kwargs):
        if not waiting.is_set():
            threading.Thread(target=capacity.warm, args=([SHAPE],), kwargs={"wait": 5},
                             daemon=True).start()
            assert waiting.wait(5), "the second caller never waited for the first"
        return real_score(self, *args, **kwargs)

    monkeypatch.setattr(WorkerCapacity, "_wait_for", staticmethod(wait_for))
    monkeypatch.setattr(capacity_module._Kept, "score", score)
    assert capacity.warm([SHAPE], wait=5) == 1
    eventually(lambda: list(ended), lambda seen: seen != [],
               expected="the waiting caller to return")
    assert ended[0] is True, "the wait ran out: the warming could not hand its heap in"


def test_a_placement_that_starts_while_its_job_is_warmed_waits_and_scores_nothing(
        monkeypatch):
    """The job's reconcile and its warming start from the same informer event: a decision
    that comes while the warming works out the job's need waits for it, and then scores no
    Node itself (the first job of a shape costs its decision no more than the rest)."""
    entered, release, waiting = threading.Event(), threading.Event(), threading.Event()
    real_build = placer_module.build_runtime_info

    def build(*args, **kwargs):
        if threading.current_thread().name == "placer-warm-ahead":
            entered.set()
            assert release.wait(10), "the test never let the warming go on"
        return real_build(*args, **kwargs)

    monkeypatch.setattr(placer_module, "build_runtime_info", build)
    scored_by = []
    real_rank = capacity_module._rank
    monkeypatch.setattr(capacity_module, "_rank", lambda *args: scored_by.append(
        threading.current_thread().name) or real_rank(*args))
    workers = [worker_cluster("worker-1", 1, runtime("u1", "5", "2"))]
    placer = Placer(Registry(*workers), "best-fit")
    real_wait = placer._warmed_one.wait_for

    def wait_for(*args, **kwargs):
        waiting.set()
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(placer._warmed_one, "wait_for", wait_for)
    placer.warm_ahead(job("a"))
    assert entered.wait(10), "the warming thread never started on the job"
    placed = []
    decision = threading.Thread(target=lambda: placed.append(placer.place(job("a"))),
                                name="decision", daemon=True)
    decision.start()
    assert waiting.wait(10), "the decision did not wait for the job's warming"
    release.set()
    decision.join(10)
    assert placed and not isinstance(placed[0], str), placed
    assert scored_by and set(scored_by) == {"placer-warm-ahead"}, scored_by
    chosen, _ = placed[0]
    assert not chosen.capacity._warmed and len(chosen.capacity._heaps) == 1
    chosen.capacity.check()


def test_a_placement_drops_its_job_s_warming_still_queued():
    workers = [worker_cluster("worker-1", 1, runtime("u1", "5", "2"))]
    placer = Placer(Registry(*workers), "best-fit")
    ran = []
    placer._ahead.append((("team-a", "a"), lambda: ran.append("a")))
    placer._own_warming(("team-a", "a"))
    assert not placer._ahead and not ran
