"""Choosing the worker a TrainJob runs on (pure: no API calls, no clocks).

``place_trainjob`` is the one choice, for the Placer (``placer``) and the unit tests
alike. The caller describes each worker as a ``Candidate``: its free room (Node room, and
in Kueue mode the smaller of that and its queue's quota), or the problem that rules it out
(not eligible, a pod that fits on no Node, no quota). Workers short of room in sum are
ruled out here; a ``PlacementPolicy`` (``policy``) picks among those that fit. When none
fits, the per-worker reasons become the pending condition's message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from dispatcher.placement.policy import POLICIES, Candidate, PlacementPolicy, Resources
from dispatcher.room.amounts import format_amount
from dispatcher.room.capacity import PODS


@dataclass
class Placement:
    """The chosen worker, or None with each worker's reason for not taking the job."""

    cluster: str | None
    reasons: dict[str, str] = field(default_factory=dict)


def shortfalls(needs: Resources, pods: int, free: Resources) -> list[str]:
    """One "64 cpu, 12 free" per resource the worker lacks. Pod slots count only when the
    worker reports them (test Nodes often leave ``pods`` out of allocatable)."""
    wanted = {resource: need for resource, need in needs.items() if need > 0}
    if pods > 0 and PODS in free:
        wanted[PODS] = max(wanted.get(PODS, Decimal(0)), Decimal(pods))
    short = []
    for resource in sorted(wanted):
        have = free.get(resource, Decimal(0))
        if have < wanted[resource]:
            short.append(f"{format_amount(resource, wanted[resource])} {resource}, "
                         f"{format_amount(resource, have)} free")
    return short


def place_trainjob(needs: Resources, pods: int, candidates: list[Candidate],
                   policy: PlacementPolicy | str = "best-fit") -> Placement:
    """Pick an eligible worker with room for ``needs`` (job totals) and ``pods`` pods, or
    for a candidate's own ``needs``/``pods`` where it gives them."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; known: {sorted(POLICIES)}")
        policy = POLICIES[policy]
    reasons: dict[str, str] = {}
    fitting = []
    for candidate in candidates:
        wants = needs if candidate.needs is None else candidate.needs
        count = pods if candidate.pods is None else candidate.pods
        if candidate.problem is not None:
            reasons[candidate.name] = candidate.problem
        elif short := shortfalls(wants, count, candidate.free):
            reasons[candidate.name] = "needs " + " and ".join(short) + (
                f" ({candidate.excluded_nodes})" if candidate.excluded_nodes else "")
        else:
            fitting.append(candidate)
    # Needs differ between workers only when their runtimes differ: rank by the largest.
    ranked_by = _largest(needs if c.needs is None else c.needs for c in fitting) \
        if fitting else needs
    chosen = policy.choose(ranked_by, fitting)
    if chosen is None:
        for candidate in fitting:  # only a policy that declines leaves these unchosen
            reasons[candidate.name] = f"fits, not chosen by {policy.name}"
    return Placement(cluster=chosen, reasons=reasons)


def _largest(requests_list) -> Resources:
    merged: Resources = {}
    for requests in requests_list:
        for resource, amount in requests.items():
            merged[resource] = max(merged.get(resource, Decimal(0)), amount)
    return merged


def describe_reasons(reasons: dict[str, str]) -> str:
    """"worker-1: ...; worker-2: ..." by worker name, for the pending condition."""
    if not reasons:
        return "no worker clusters"
    return "; ".join(f"{name}: {reasons[name]}" for name in sorted(reasons))


def message_shape(message: str) -> str:
    """A pending message with its amounts blanked out: free amounts move with every pod,
    so only a change of shape (a different reason) is worth a write or an Event."""
    return re.sub(r"\d+(\.\d+)?[A-Za-z]*", "#", message)
