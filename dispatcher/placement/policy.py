"""The placement policies: which of the workers a job fits on it goes to (pure).

A policy ranks ``Candidate`` workers that all fit the job; ``chooser.place_trainjob``
filters the workers first. ``--placement-policy`` names one of ``POLICIES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

Resources = dict[str, Decimal]


@dataclass
class Candidate:
    """One worker as placement sees it; ``problem`` is None when it is eligible."""

    name: str
    order: int  # position in MultiKueueConfig.spec.clusters: breaks ties
    free: Resources = field(default_factory=dict)
    problem: str | None = None
    # What the job asks of this worker when it differs from the job's totals given to
    # ``place_trainjob`` (each worker holds its own copy of the job's runtime).
    needs: Resources | None = None
    pods: int | None = None
    # Which rule keeps Nodes out ("2 without label pool=gpu (nodeSelector)"), named after
    # a shortfall: the rest of the Nodes lacking room is not the whole story.
    excluded_nodes: str = ""


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
