"""arrival.stranded: whether some order of arrival leaves a pending pod without a Node."""

from decimal import Decimal as D

from dispatcher.room.arrival import UNKNOWN, Budget, PendingPod, most_pods, stranded

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


def test_a_node_that_does_not_count_pod_slots_never_runs_out_of_them():
    bare = {"a": {"cpu": D(2)}, "b": {"cpu": D(2)}}
    # One 1-cpu pod, on a or on b, leaves the other Node open to the 2-cpu pod.
    assert stranded([cpu(2), cpu(1)], bare) is None
    assert stranded([cpu(2), cpu(1), cpu(1)], bare) == cpu(2)
    assert bare == {"a": {"cpu": D(2)}, "b": {"cpu": D(2)}}  # the caller's room untouched


def test_a_search_past_its_budget_says_it_does_not_know():
    pods = [cpu(1)] * 12 + [cpu(5)]
    nodes = room(a=6, b=6, c=6)
    # Pods kept to a and b: 16 cpu of them on 12.
    assert stranded(pods, nodes) == cpu(1)
    assert stranded(pods, nodes, Budget(3)) is UNKNOWN


def test_questions_asked_with_one_budget_share_it():
    pods = [cpu(1)] * 12 + [cpu(5)]
    nodes = room(a=6, b=6, c=6)
    budget = Budget(10_000)
    stranded(pods, nodes, budget)
    one = 10_000 - budget.left
    assert one > 0
    stranded(pods, nodes, budget)
    assert budget.left == 10_000 - 2 * one
    # Exactly what one answer costs is enough for it; a unit less is not.
    assert stranded(pods, nodes, Budget(one)) == cpu(1)
    assert stranded(pods, nodes, Budget(one - 1)) is UNKNOWN


def test_past_most_pods_a_search_does_not_know_at_its_first_look():
    """A caller with more pending pods than ``most_pods`` need not list them: the answer
    would be UNKNOWN whatever they are (here, with budget enough, None)."""
    nodes = room(**{f"n{i}": 1 for i in range(40)}, a=100)
    most = most_pods(Budget(100), len(nodes))
    assert most == 60
    small = cpu(1, lands=None, asked=None)
    one = cpu(2, lands=frozenset("a"), asked=frozenset("a"))
    for count in (most + 1, most + 20):
        pods = [one] + [small] * (count - 1)
        assert stranded(pods, nodes, Budget(100)) is UNKNOWN, count
        assert stranded(pods, nodes, Budget(1000)) is None, count
    assert stranded([one] + [small] * (most - 3), nodes, Budget(100)) is None
