"""The order in which jobs waiting for room get it, and the rule that keeps it (pure: no
API calls, no clocks).

A job waits when no worker has room for it (standalone mode's ``NoWorkerFits``). Waiting
jobs stand in one line: highest priority first, then the oldest (creationTimestamp), then
by namespace and name, so that every replica and every restart agrees. Each entry also
says which workers it could use were room to free there (its *candidates*: eligible, its
cluster selector matching, and its pods fitting the Nodes its rules admit were nothing else
running), because the rule is about room, not about turns:

    a job may take room on a worker only when no job ahead of it in the line has that
    worker among its candidates.

So a lower-priority (or younger) job never takes room that one ahead of it could use, and
it still goes where none of those could ever fit (another pool, a worker too small for
them), which a strict turn-by-turn queue would forbid for nothing. Nothing running is ever
preempted: the line only decides who is placed next.

The check is cheap: each worker keeps the ranks of the waiting jobs that are its
candidates, sorted, so "is anyone ahead of me there" reads the first of them (a job
being placed asks once per worker, whatever the number of waiting jobs). A job held back
is recorded against the jobs that held it; when one of those leaves the line (placed,
deleted, suspended) or stops wanting a worker, the jobs it held are looked at again: no
event about room would bring them back, since a placement frees none.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

JobKey = tuple[str, str]
# (-priority, creationTimestamp, namespace, name): sorts in line order. creationTimestamp
# is RFC 3339 in UTC with whole seconds, as the apiserver writes it: its text sorts as
# its time does.
Rank = tuple[int, str, str, str]

# Sorts after any timestamp: a job whose creation time is unknown goes last among equals.
_UNKNOWN_TIME = "~"


def rank_of(priority: int, created: str | None, key: JobKey) -> Rank:
    """A job's place in line: higher ``priority`` first, then older, then by key."""
    return (-priority, created or _UNKNOWN_TIME, key[0], key[1])


def job_of(rank: Rank) -> JobKey:
    """The job standing at ``rank``."""
    return rank[2], rank[3]


def priority_of(rank: Rank) -> int:
    """The priority of the job standing at ``rank``."""
    return -rank[0]


@dataclass
class _Entry:
    rank: Rank
    priority_class: str
    candidates: frozenset[str]
    # Jobs behind this one that were held back because of it.
    holds: set[JobKey] = field(default_factory=set)


@dataclass(frozen=True)
class Waiting:
    """One job's place in line, as the dashboard shows it (``position`` from 1)."""

    position: int
    key: JobKey
    priority: int
    priority_class: str
    candidates: tuple[str, ...]


class WaitingLine:
    """The waiting jobs in line order, indexed by the workers each could use; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[JobKey, _Entry] = {}
        self._ranks: list[Rank] = []  # every entry's rank, sorted
        self._by_worker: dict[str, list[Rank]] = {}  # worker -> its candidates' ranks, sorted

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: JobKey) -> bool:
        return key in self._entries

    def join(self, key: JobKey, rank: Rank, candidates: frozenset[str],
             priority_class: str = "") -> set[JobKey]:
        """Put the job in line at ``rank``, wanting room on ``candidates`` (again: its
        rank and candidates are replaced). Returns the jobs to look at again: those it
        held back, when it no longer wants a worker it wanted, or stands further back."""
        with self._lock:
            entry = self._entries.get(key)
            released: set[JobKey] = set()
            if entry is not None:
                if entry.rank == rank and entry.candidates == candidates:
                    entry.priority_class = priority_class
                    return released
                if rank > entry.rank or not candidates >= entry.candidates:
                    released, entry.holds = entry.holds, set()
                self._unindex(entry)
                entry.rank, entry.candidates = rank, candidates
                entry.priority_class = priority_class
            else:
                entry = self._entries[key] = _Entry(rank, priority_class, candidates)
            bisect.insort(self._ranks, rank)
            for worker in candidates:
                bisect.insort(self._by_worker.setdefault(worker, []), rank)
            return released

    def leave(self, key: JobKey) -> set[JobKey]:
        """Take the job out of the line; returns the jobs it held back, to look at again."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return set()
            self._unindex(entry)
            # Other entries may still list it among the jobs they held: looking at a job
            # again once too often costs a reconcile that finds nothing to do, cheaper than
            # a walk over the line at every placement.
            return entry.holds

    def _unindex(self, entry: _Entry) -> None:
        _remove(self._ranks, entry.rank)
        for worker in entry.candidates:
            ranks = self._by_worker.get(worker)
            if ranks is not None:
                _remove(ranks, entry.rank)
                if not ranks:
                    del self._by_worker[worker]

    def ahead_on(self, key: JobKey, rank: Rank) -> dict[str, Rank]:
        """For each worker where a waiting job ahead of ``rank`` could use the room: the
        rank of that job (the first in line there). The job ``key`` itself is never ahead
        of itself, whatever rank it stood at before."""
        ahead: dict[str, Rank] = {}
        with self._lock:
            for worker, ranks in self._by_worker.items():
                first = ranks[0]
                if (first[2], first[3]) == key:
                    if len(ranks) == 1:
                        continue
                    first = ranks[1]
                if first < rank:
                    ahead[worker] = first
        return ahead

    def hold(self, key: JobKey, by: set[JobKey]) -> bool:
        """Record that ``key`` was held back by the jobs ``by``, so that it is looked at
        again when one of them leaves the line. False when one left already (it may have
        left between the check and now): look at it again at once."""
        with self._lock:
            gone = False
            for holder in by:
                entry = self._entries.get(holder)
                if entry is None:
                    gone = True
                else:
                    entry.holds.add(key)
            return not gone

    def order(self) -> list[Waiting]:
        """Every waiting job in line order."""
        with self._lock:
            line = []
            for position, rank in enumerate(self._ranks, start=1):
                key = (rank[2], rank[3])
                entry = self._entries[key]
                line.append(Waiting(position, key, -rank[0], entry.priority_class,
                                    tuple(sorted(entry.candidates))))
            return line

    def keys(self) -> list[JobKey]:
        """The waiting jobs in line order (the order to look at them again in)."""
        with self._lock:
            return [(rank[2], rank[3]) for rank in self._ranks]


def _remove(ranks: list[Rank], rank: Rank) -> None:
    at = bisect.bisect_left(ranks, rank)
    if at < len(ranks) and ranks[at] == rank:
        del ranks[at]
