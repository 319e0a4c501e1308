"""arrival.stranded: whether some order of arrival leaves a pending pod without a Node."""

from decimal import Decimal as D

from dispatcher.placement.arrival import PendingPod, stranded

AB = frozenset("ab")


def cpu(amount, lands=AB, asked=AB):
    return PendingPod({"cpu": D(amount), "pods": D(1)}, lands, asked)


def room(**cpus):
    return {name: {"cpu": D(amount), "pods": D(110)} for name, amount in cpus.items()}


def test_an_interleaving_strands_the_large_pod():
    wide = cpu(3)
    assert stranded([wide, wide, cpu(1), cpu(1)], room(a=4, b=4)) == wide
    # One small pod cannot close both Nodes to the second wide pod.
    assert stranded([wide, wide, cpu(1)], room(a=4, b=4)) is None


def test_rivals_only_land_where_their_rules_let_them():
    # One small pod on a and two on b close both to 3 cpu; kept to b, they leave a open.
    small = cpu(1, lands=frozenset("b"))
    assert stranded([cpu(3), small, small, small], room(a=3, b=4)) is None
    assert stranded([cpu(3), cpu(1), cpu(1), cpu(1)], room(a=3, b=4)) == cpu(3)


def test_a_pod_not_asked_only_counts_against_the_others():
    lump = cpu(5, lands=None, asked=None)
    assert stranded([lump], room(a=4)) is None
    assert stranded([lump, cpu(4)], room(a=3, b=8)) == cpu(4)


def test_a_pod_that_fits_nowhere_alone_is_not_an_order_s_doing():
    assert stranded([cpu(9)], room(a=4, b=4)) is None


def test_nodes_that_do_not_count_a_resource_are_not_closed_by_it():
    # Pod slots only where the Node lists them (as the scheduler counts them).
    counted = {"a": {"cpu": D(8), "pods": D(2)}, "b": {"cpu": D(8), "pods": D(2)}}
    assert stranded([cpu(1)] * 5, counted) == cpu(1)
    assert stranded([cpu(1)] * 5, {"a": {"cpu": D(8)}, "b": {"cpu": D(8)}}) is None


def test_a_search_past_its_budget_lets_the_packing_stand():
    pods = [cpu(1)] * 12 + [cpu(5)]
    nodes = room(a=6, b=6, c=6)
    assert stranded(pods, nodes) is not None
    assert stranded(pods, nodes, budget=3) is None
