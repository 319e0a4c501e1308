"""Choosing the worker a TrainJob runs on (pure: no API calls, no clocks).

The caller describes each worker as a Candidate (free capacity from its WorkerCapacity, or
the problem that makes it ineligible); a PlacementPolicy picks among those that fit. When
none fits, the per-worker reasons become the pending condition's message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from dispatcher.amounts import format_amount
from dispatcher.capacity import PODS

Resources = dict[str, Decimal]


@dataclass
class Candidate:
    """One worker as placement sees it; ``problem`` is None when it is eligible."""

    name: str
    order: int  # position in MultiKueueConfig.spec.clusters: breaks ties
    free: Resources = field(default_factory=dict)
    problem: str | None = None


@dataclass
class Placement:
    """The chosen worker, or None with each worker's reason for not taking the job."""

    cluster: str | None
    reasons: dict[str, str] = field(default_factory=dict)


class PlacementPolicy(Protocol):
    name: str

    def choose(self, needs: Resources, candidates: list[Candidate]) -> str | None:
        """The name of one of ``candidates`` (all of which fit), or None."""


def _leftover(needs: Resources, free: Resources) -> list[Decimal]:
    # Fractions, so cpu cores, bytes and GPUs compare on one scale.
    out = []
    for resource, need in needs.items():
        have = free.get(resource, Decimal(0))
        if need > 0:
            out.append((have - need) / have if have > 0 else Decimal(0))
    return out


def _mean_leftover(needs: Resources, free: Resources) -> float:
    fractions = _leftover(needs, free)
    return sum(fractions) / len(fractions) if fractions else 0.0


class BestFit:
    """The tightest worker: the smallest mean leftover fraction over the requested
    resources after placing the job (the scheduler's MostAllocated scoring, per cluster).
    Packs, keeping big holes free for big jobs."""

    name = "best-fit"

    def choose(self, needs: Resources, candidates: list[Candidate]) -> str | None:
        if not candidates:
            return None
        return min(candidates, key=lambda c: (_mean_leftover(needs, c.free), c.order)).name


class WorstFit:
    """The roomiest worker: the largest mean leftover fraction (LeastAllocated). Spreads
    load."""

    name = "worst-fit"

    def choose(self, needs: Resources, candidates: list[Candidate]) -> str | None:
        if not candidates:
            return None
        return min(candidates, key=lambda c: (-_mean_leftover(needs, c.free), c.order)).name


class FirstFit:
    """The first worker in configuration order that fits."""

    name = "first-fit"

    def choose(self, needs: Resources, candidates: list[Candidate]) -> str | None:
        return min(candidates, key=lambda c: c.order).name if candidates else None


POLICIES: dict[str, PlacementPolicy] = {
    "best-fit": BestFit(), "worst-fit": WorstFit(), "first-fit": FirstFit(),
}


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
    """Pick an eligible worker with room for ``needs`` (job totals) and ``pods`` pods."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; known: {sorted(POLICIES)}")
        policy = POLICIES[policy]
    reasons: dict[str, str] = {}
    fitting = []
    for candidate in candidates:
        if candidate.problem is not None:
            reasons[candidate.name] = candidate.problem
        elif short := shortfalls(needs, pods, candidate.free):
            reasons[candidate.name] = "needs " + " and ".join(short)
        else:
            fitting.append(candidate)
    chosen = policy.choose(needs, fitting)
    if chosen is None:
        for candidate in fitting:  # only a policy that declines leaves these unchosen
            reasons[candidate.name] = f"fits, not chosen by {policy.name}"
    return Placement(cluster=chosen, reasons=reasons)


def describe_reasons(reasons: dict[str, str]) -> str:
    """"worker-1: ...; worker-2: ..." by worker name, for the pending condition."""
    if not reasons:
        return "no worker clusters"
    return "; ".join(f"{name}: {reasons[name]}" for name in sorted(reasons))


def message_shape(message: str) -> str:
    """A pending message with its amounts blanked out: free amounts move with every pod,
    so only a change of shape (a different reason) is worth a write or an Event."""
    return re.sub(r"\d+(\.\d+)?[A-Za-z]*", "#", message)
