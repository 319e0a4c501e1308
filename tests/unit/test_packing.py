"""The packing decision on plain data (pure): where a job's pods go in each order, the held
pods of placed jobs moved off a Node left short, ties, and the reasons a job is refused."""

from __future__ import annotations

from decimal import Decimal as D

from dispatcher.room import packing
from dispatcher.room.packing import (
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    Admitted,
    Order,
    Snapshot,
    decide,
    fits_on_empty,
    largest_first,
    no_node_for,
    pack_in_order,
    sign_of,
)

GPU = "nvidia.com/gpu"
JOB = ("team-a", "placed")


def cpu(amount: int, pods: int = 1) -> dict:
    return {"cpu": D(amount), "pods": D(pods)}


def snapshot(allocatable: dict[str, dict], *, held: dict[str, dict] | None = None,
             scoring: str = LEAST_ALLOCATED, reads: list | None = None) -> Snapshot:
    """A worker with nothing bound whose Nodes allocate ``allocatable``, and one placed
    job (``JOB``) holding ``held`` per Node; ``reads`` records which room was read."""
    holds = {JOB: held} if held else {}

    def room(kind: str, with_held: bool):
        def read(name: str) -> dict:
            if reads is not None:
                reads.append((kind, name))
            free = dict(allocatable[name])
            for resource, amount in (holds.get(JOB, {}).get(name, {}) if with_held
                                     else {}).items():
                free[resource] -= amount
            return free
        return read

    held_room = room("held", True)
    short = {name for name in (held or {}) if any(a < 0 for a in held_room(name).values())}
    if reads is not None:
        reads.clear()
    return Snapshot(admitted=Admitted.of("any", allocatable), held_room=held_room,
                    bound_room=room("bound", False), sign=sign_of(scoring), holds=holds,
                    holding=set(held or {}), short=short)


def test_pods_are_packed_largest_first_each_taking_a_pod_slot():
    assert largest_first([{"cpu": D(1)}, {"cpu": D(4)}, {"cpu": D(2), "pods": D(3)}]) == [
        cpu(4), cpu(2, pods=3), cpu(1)]


def test_least_allocated_spreads_and_most_allocated_packs_ties_by_name():
    nodes = {"b": cpu(8, pods=110), "a": cpu(8, pods=110)}
    wanted = largest_first([{"cpu": D(2)}] * 3)
    spread = decide(wanted, snapshot(nodes))
    assert spread.pods == {"a": [cpu(2), cpu(2)], "b": [cpu(2)]}, spread.pods
    packed = decide(wanted, snapshot(nodes, scoring=MOST_ALLOCATED))
    assert packed == {"a": cpu(6, pods=3)}, packed


def test_held_first_packs_around_the_held_room_job_first_where_the_scheduler_sees_room():
    """Node a holds 6 of its 8 cpu for a placed job whose pod is not bound. Around it, a
    3-cpu pod goes to b; the scheduler, blind to the hold, would put it on a (the emptier),
    and then the held 6-cpu pod finds no Node: the job is refused, saying so."""
    nodes = {"a": cpu(8, pods=110), "b": cpu(4, pods=110)}
    world = snapshot(nodes, held={"a": cpu(6)})
    wanted = largest_first([{"cpu": D(3)}])
    assert pack_in_order(Order.HELD_FIRST, wanted, world) == {"b": cpu(3)}
    refusal = ("the pods of placed jobs would be left without room: no Node has room for a "
               "pod of 6 cpu (most free on one Node: 5)")
    assert pack_in_order(Order.JOB_FIRST, wanted, world) == refusal
    assert decide(wanted, world) == refusal


def test_a_held_pod_on_a_node_left_short_moves_where_there_is_room():
    nodes = {"a": cpu(8, pods=110), "b": cpu(8, pods=110)}
    world = snapshot(nodes, held={"a": cpu(6)})
    wanted = largest_first([{"cpu": D(4)}])
    # Blind to the hold, the scheduler sees a and b alike and takes a (ties by name): a is
    # left short, and its held 6-cpu pod moves to b, which has room. Around the hold, b.
    assert pack_in_order(Order.JOB_FIRST, wanted, world) == {"a": cpu(4)}
    assert pack_in_order(Order.HELD_FIRST, wanted, world) == {"b": cpu(4)}
    assert decide(wanted, world) == {"b": cpu(4)}
    # Held room already over what a has left: the held pod moves to b first.
    over = snapshot(nodes, held={"a": cpu(10)})
    assert decide(largest_first([{"cpu": D(7)}]), over) == (
        "the pods of placed jobs would be left without room: no Node has room for a pod "
        "of 10 cpu (most free on one Node: 8)")


def test_without_held_room_on_its_nodes_one_order_is_packed():
    reads: list = []
    nodes = {"a": cpu(8, pods=110), "b": cpu(8, pods=110)}
    plan = decide(largest_first([{"cpu": D(2)}]), snapshot(nodes, reads=reads))
    assert plan == {"a": cpu(2)}
    assert {kind for kind, _ in reads} == {"held"}, reads


def test_refusals_name_the_resource_and_the_most_free_on_one_node():
    nodes = {"a": {**cpu(8, pods=110), GPU: D(1)}, "b": {**cpu(4, pods=110), GPU: D(2)}}
    world = snapshot(nodes)
    assert decide(largest_first([{"cpu": D(12)}]), world) == (
        "no Node has room for a pod of 12 cpu (most free on one Node: 8)")
    assert decide(largest_first([{"cpu": D(6), GPU: D(2)}]), world) == (
        f"no Node has room for a pod of 6 cpu and 2 {GPU} together")
    assert decide(largest_first([{"cpu": D(1)}]), snapshot({})) == "no Node admits its pods"
    assert no_node_for(cpu(9), {"a": {"cpu": D(-2)}}) == (
        "no Node has room for a pod of 9 cpu (most free on one Node: 0)")


def test_a_job_fits_on_empty_nodes_fullest_first():
    nodes = {"a": cpu(8), "b": cpu(4)}
    assert fits_on_empty(largest_first([{"cpu": D(4)}, {"cpu": D(8)}]), nodes)
    assert not fits_on_empty(largest_first([{"cpu": D(6)}, {"cpu": D(6)}]), nodes)
    assert not fits_on_empty(largest_first([{"cpu": D(1)}]), {})


def test_a_packer_from_a_kept_heap_scores_only_the_nodes_it_changes(monkeypatch):
    """Alike pods over a heap kept between packings: each Node a pod takes is scored again
    (its room changed), no other; without a kept heap every Node is scored once. Both put
    the pods where the scheduler would."""
    nodes = {f"n{i:02}": {"cpu": D(8 + i % 3), "memory": D(2**35), "pods": D(110)}
             for i in range(40)}
    wanted = largest_first([{"cpu": D(2), "memory": D(2**30)}] * 4)
    sign = sign_of(LEAST_ALLOCATED)
    heap = sorted((packing.rank(room, nodes[name], wanted[0], sign), name, 0, 0)
                  for name, room in nodes.items())
    scored: list[str] = []
    real = packing.rank
    monkeypatch.setattr(packing, "rank", lambda *args: scored.append(1) or real(*args))
    places = []
    for kept in (lambda shape: (list(heap), {}), None):
        scored.clear()
        packer = packing.Packer(packing.Rooms(nodes, nodes.__getitem__), nodes, sign,
                                kept=kept)
        places.append([packer.take(pod) for pod in wanted])
        places.append(len(scored))
    assert places == [["n02", "n05", "n08", "n11"], 4,
                      ["n02", "n05", "n08", "n11"], len(nodes) + 4], places
