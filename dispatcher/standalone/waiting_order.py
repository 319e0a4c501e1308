"""Standalone mode's side of the waiting line (``placement.waiting_line``): what the
reconciler asks before placing a job (which workers the line holds for jobs ahead of it),
and what it tells after (the job waits, with its priority and candidates; or it no longer
waits, and the jobs it held back are looked at again).

A job's priority and candidates are worked out from the same needs placement uses (one
per worker, from that worker's copy of the runtime; cached by the Placer), so asking costs
little more than the placement itself, and only while some job waits: with the line empty
nothing is asked at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dispatcher.placement import cluster_selector
from dispatcher.placement.chooser import shortfalls
from dispatcher.placement.need import Need
from dispatcher.placement.placer import Placer, content_digest
from dispatcher.placement.priority import PriorityClasses
from dispatcher.placement.waiting_line import (
    JobKey,
    Rank,
    Waiting,
    WaitingLine,
    job_of,
    priority_of,
    rank_of,
)
from dispatcher.workers.registry import WorkerRegistry
from trainjob import conditions
from trainjob import constants as c

log = logging.getLogger(__name__)


@dataclass
class Turn:
    """A job's standing in line (rank, priority and the class it comes from, its need on
    each eligible worker) and the workers held for jobs ahead of it."""

    rank: Rank
    priority: int
    priority_class: str
    needs: dict[str, Need]
    # The job's content digest (``placer.content_digest``), for placement to reuse.
    content: bytes
    ahead: dict[str, Rank] = field(default_factory=dict)
    # Why each held worker is not this job's, as placement reports a worker it skips.
    skip: dict[str, str] = field(default_factory=dict)


class PlacementOrder:
    """The waiting line of one dispatcher, and how a job's place in it is worked out."""

    def __init__(self, placer: Placer, registry: WorkerRegistry,
                 priorities: PriorityClasses | None = None,
                 requeue: Callable[[Iterable[JobKey]], None] = lambda keys: None):
        self.placer = placer
        self.registry = registry
        self.priorities = priorities or PriorityClasses()
        self.line = WaitingLine()
        self._requeue = requeue

    def turn(self, raw: dict) -> Turn | None:
        """Where ``raw`` stands before it is placed: None while no job waits (nothing to
        ask), else its standing and the workers held for jobs ahead of it."""
        if not len(self.line):
            return None
        key = _key(raw)
        turn = self._standing(raw, key)
        turn.ahead = self.line.ahead_on(key, turn.rank)
        for name, rank in turn.ahead.items():
            turn.skip[name] = self._held_reason(name, turn, rank)
        return turn

    def _held_reason(self, worker_name: str, turn: Turn, ahead: Rank) -> str:
        """What the job is told about a worker held for ``ahead``: that, when the job would
        fit there; else what it lacks, as placement would say (the worker is skipped all
        the same: room freed between this check and the choice is not the job's)."""
        need, worker = turn.needs.get(worker_name), self.registry.get(worker_name)
        if need is not None and worker is not None:
            short = shortfalls(need.requests, need.pods,
                               worker.capacity.free(need.node_selector, need.tolerations))
            if short:
                excluded = worker.capacity.excluded_by_rules(need.node_selector,
                                                             need.tolerations)
                return "needs " + " and ".join(short) + (f" ({excluded})" if excluded else "")
        return "held for {}/{} (priority {}), ahead in the waiting line; this job's " \
               "priority: {}".format(*job_of(ahead), priority_of(ahead), turn.priority)

    def waits(self, raw: dict, turn: Turn | None) -> bool:
        """The job found no room: it joins the line (or keeps its place, updated). False
        when a job that held it back has left the line meanwhile: look at it again now."""
        key = _key(raw)
        if turn is None:
            turn = self._standing(raw, key)
        candidates = self._candidates(raw, turn.needs)
        self._requeue(self.line.join(key, turn.rank, candidates, turn.priority_class))
        return self.line.hold(key, {job_of(rank) for rank in turn.ahead.values()}) \
            if turn.ahead else True

    def restore(self, jobs: Iterable[dict]) -> int:
        """Put back in line the jobs a previous leader left waiting for room (``Placed``
        False, ``NoWorkerFits``, not placed since), before any is reconciled: else whichever
        came first in the list would take freed room ahead of its betters. Returns how many."""
        count = 0
        for raw in jobs:
            meta = raw["metadata"]
            placed = conditions.find(raw, c.CONDITION_PLACED) or {}
            if (meta.get("annotations") or {}).get(c.PLACEMENT_ANNOTATION) \
                    or meta.get("deletionTimestamp") or (raw.get("spec") or {}).get("suspend") \
                    or conditions.finished(raw) or placed.get("status") != "False" \
                    or placed.get("reason") != c.REASON_NO_WORKER:
                continue
            self.waits(raw, None)
            count += 1
        return count

    def left(self, key: JobKey) -> None:
        """The job no longer waits (placed, suspended, deleted, at rest)."""
        if key in self.line:
            released = self.line.leave(key)
            if released:
                log.debug("TrainJob %s/%s left the waiting line; looking again at %d held "
                          "behind it", *key, len(released))
                self._requeue(released)

    def order(self) -> list[Waiting]:
        """The waiting jobs in line order."""
        return self.line.order()

    def _standing(self, raw: dict, key: JobKey) -> Turn:
        needs = {}
        content = content_digest(raw)  # the same for every worker: digested once
        for worker in self.registry.snapshot():
            _, need = self.placer.need_on(raw, worker, content)
            if need is not None:
                needs[worker.name] = need
        # Each worker holds its own copy of the runtime: normally the same, and when they
        # differ the highest class any of them names counts (the line is one for all).
        names = {name for need in needs.values() for name in need.priority_classes}
        priority, priority_class = self.priorities.job_priority(sorted(names))
        created = raw["metadata"].get("creationTimestamp")
        return Turn(rank_of(priority, created, key), priority, priority_class, needs, content)

    def _candidates(self, raw: dict, needs: dict[str, Need]) -> frozenset[str]:
        """The workers whose room the job could use were it freed: eligible, selected by
        its cluster selector, and with Nodes its pods would fit on were nothing running."""
        selected = cluster_selector.select(
            cluster_selector.selector_of(raw["metadata"].get("annotations")),
            needs, self.registry.labels)
        if isinstance(selected, cluster_selector.Unplaceable):
            return frozenset()
        candidates = set()
        for name in selected:
            worker = self.registry.get(name)
            need = needs[name]
            if worker is not None and worker.capacity.could_fit(
                    need.each_pod, need.node_selector, need.tolerations):
                candidates.add(name)
        return frozenset(candidates)


def _key(raw: dict) -> JobKey:
    return raw["metadata"].get("namespace") or "", raw["metadata"]["name"]
