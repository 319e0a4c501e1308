"""Whether pods that are not bound yet could leave one of them without a Node, in some
order of arrival at the scheduler (pure).

Packing (``WorkerCapacity.pack``) finds Nodes for a job's pods as the scheduler would put
them in two orders: the pods of jobs placed before it first, or its own first. Pods come in
any order, though (a small job's pod between a large job's two), and the scheduler's choice
among the Nodes that fit is not only the resource score packing models (it balances, it
spreads, it breaks ties at random). A small pod on the Node a large one was counted on can
leave the large one with no Node at all, Pending until something ends.

So this asks the worst case: could the other pending pods, each put on some Node where it
fits when it comes, leave no Node with room for a given one? A Node that could take every
other pending pod and still fit it says no at once (the usual case: room to spare);
otherwise a bounded search tries the others on the Nodes it may use, and says when it
ran out of budget before it knew (``UNKNOWN``), so that a caller can lean the safe way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from dispatcher.room.amounts import accumulate, fits, shift

Resources = dict[str, Decimal]

# Units of work per placement, shared by its questions (``Budget``): the close cases the
# search is for are a few pods on a few Nodes, and it runs under the capacity lock. A
# unit is about one Node or pod looked at once (a few microseconds); past the budget the
# answer is ``UNKNOWN``.
SEARCH_BUDGET = 1500


@dataclass
class PendingPod:
    """A pod not bound yet. ``lands``: the Nodes it may go to as a rival of others (None:
    any where it fits); ``asked``: the Nodes its own room is checked on (None: it is not
    checked, only counted against the others)."""

    amounts: Resources
    lands: frozenset[str] | None
    asked: frozenset[str] | None


class _Unknown:
    """The answer of a search that ran out of budget: neither a pod nor None."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class Budget:
    """The units of search work left, spent by every question asked with it."""

    def __init__(self, units: int | None = None):
        self.left = SEARCH_BUDGET if units is None else units

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise _OutOfBudget


class _OutOfBudget(Exception):
    pass


def most_pods(budget: Budget, nodes: int) -> int:
    """The most pending pods ``stranded`` can be asked about over ``nodes`` Nodes before
    its first step runs out of ``budget`` (its answer then ``UNKNOWN``, before any order is
    tried): a caller with more need not list them."""
    return budget.left + 1 - nodes


def stranded(pods: Sequence[PendingPod], room: dict[str, Resources],
             budget: Budget | None = None) -> PendingPod | _Unknown | None:
    """A pod of ``pods`` that some order of arrival leaves without a Node, given each Node's
    ``room`` with bound pods only; None when every order binds them all; ``UNKNOWN`` when
    the search ran out of ``budget`` (default: a budget of its own) before it knew."""
    budget = budget or Budget()
    done: set = set()
    try:
        for index, pod in enumerate(pods):
            if pod.asked is None:
                continue
            # Pods alike meet the same rivals: one answer serves them all.
            key = (tuple(sorted(pod.amounts.items())), pod.lands, pod.asked)
            if key in done:
                continue
            done.add(key)
            if _can_strand(pod, [*pods[:index], *pods[index + 1:]], room, budget):
                return pod
    except _OutOfBudget:
        return UNKNOWN
    return None


def _can_strand(pod: PendingPod, others: list[PendingPod], room: dict[str, Resources],
                budget: Budget) -> bool:
    wanted = pod.amounts
    # Setting up costs a look at each Node and each other pod.
    budget.spend(len(room) + len(others))
    nodes = sorted(n for n in pod.asked if n in room and fits(room[n], wanted))
    if not nodes:
        return False  # no room even alone: packing's business, not an order's
    if budget.left < 1 + len(nodes):
        # The search's first step looks at each of these Nodes: it would run out there,
        # so the rivals are not sorted nor the Nodes' room copied for it.
        raise _OutOfBudget
    rivals = sorted((o for o in others if o.lands is None or not o.lands.isdisjoint(nodes)),
                    key=lambda o: sorted(o.amounts.items()), reverse=True)
    # What the rivals from the i-th on could take, in all.
    after: list[Resources] = [{}]
    for rival in reversed(rivals):
        after.append(dict(after[-1]))
        accumulate(after[-1], rival.amounts)
    after.reverse()
    left = {n: dict(room[n]) for n in nodes}
    return _search(wanted, rivals, 0, left, after, budget, set())


def _search(wanted: Resources, rivals: list[PendingPod], i: int, left: dict[str, Resources],
            after: list[Resources], budget: Budget, seen: set) -> bool:
    """Whether rivals ``i`` on, each on an open Node where it fits or not at all, can
    close every Node to ``wanted``."""
    budget.spend(1 + len(left))
    open_nodes = [n for n, free in left.items() if fits(free, wanted)]
    if not open_nodes:
        return True
    # A Node that fits ``wanted`` after all the rivals left stays open whatever they do.
    if any(fits(_minus(left[n], after[i]), wanted) for n in open_nodes):
        return False
    state = (i, tuple((n, tuple(sorted(left[n].items()))) for n in open_nodes))
    if state in seen:
        return False
    seen.add(state)
    rival = rivals[i]
    for n in open_nodes:
        if (rival.lands is None or n in rival.lands) and fits(left[n], rival.amounts):
            shift(left[n], rival.amounts, -1)
            closed = _search(wanted, rivals, i + 1, left, after, budget, seen)
            shift(left[n], rival.amounts)
            if closed:
                return True
    # It lands on another Node, or after ``wanted`` has its own.
    return _search(wanted, rivals, i + 1, left, after, budget, seen)


def _minus(free: Resources, taken: Resources) -> Resources:
    # Only what the Node counts: a resource it does not list stays unlisted.
    return {r: amount - taken.get(r, Decimal(0)) for r, amount in free.items()}
