"""The worker's reasons on the manager, decided: which job a worker's Warning Event is
about (``attribute``), and how its occurrences are counted into the manager Events that
show them (``Aggregation``). Pure but for a lock; the watching is ``warning_events.py``,
the writing ``worker_event_mirror.py``. Both modes use it; what differs is only whose
copies are followed and which manager job a copy stands for (``CopyOwners``): the
dispatcher's own copies in standalone mode (``standalone/copy_owners.py``), Kueue's in
Kueue mode (``kueue/copy_owners.py``).

A Warning Event of a worker is shown on the manager's TrainJob when it is about that job's
copy (of this very manager job, on the worker the job runs on) or about the JobSet, Jobs
and Pods the copy made there. Each is one manager Event per (worker, object, reason,
message), as Kubernetes aggregates repeated Events: a repeat on the worker, whether a new
Event object or a higher ``count`` or ``series.count`` of the same one, raises that
Event's ``count``. A crash-looping or rescheduled job makes new objects (a Job's new
Pods), so the distinct Events a job gets are limited too: ``MAX_NEW_PER_MINUTE`` a minute
each.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from controller_kit.api_time import format_time, parse_time
from controller_kit.events import MESSAGE_LIMIT
from trainjob import constants as c

# New manager Events (distinct reason, object and message) per job in any minute; the
# occurrences of any more are counted in one Event of REASON_LIMITED. Counted rather than
# only dropped and told by a metric: whoever reads `kubectl describe trainjob` learns that
# more went wrong than is shown and where to look, which a metric of the dispatcher's would
# tell only its operators; and the one Event's count grows, so it can never be a storm
# itself.
MAX_NEW_PER_MINUTE = 10
WINDOW_SECONDS = 60.0
REASON_LIMITED = "WorkerEventsLimited"
# A manager Event no longer raised after this long is forgotten (the apiserver's default
# --event-ttl: the Event is gone by then too, and a repeat makes a new one). What was seen
# of a worker's Event is kept twice as long: the worker keeps its Events as long, so none
# is counted twice.
IDLE_SECONDS = 3600.0

# The names the JobSet controller and the Job controller give (the JobSet is named after
# the TrainJob): Jobs <jobset>-<replicatedJob>-<index>, their Pods <job>-<index>-<random>
# (indexed Jobs; <job>-<random> otherwise). Read only for Pods no longer cached (the
# dispatcher caches unfinished Pods) and for Jobs (not cached at all).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_JOB_TAIL = re.compile(rf"{_DNS_LABEL}-\d+")
_POD_TAIL = re.compile(rf"{_DNS_LABEL}-\d+(-\d+)?-[a-z0-9]{{5}}")


class JobRef(NamedTuple):
    """The manager TrainJob an Event is shown on."""

    namespace: str
    name: str
    uid: str


def occurrences(event: dict[str, Any]) -> int:
    """How many times a worker Event happened: an events.k8s.io series' count, else the
    core/v1 count, else once."""
    series = (event.get("series") or {}).get("count")
    return max(int(series or 0), int(event.get("count") or 0), 1)


def _second(stamp: str | None) -> str:
    """An API time (metav1.Time or MicroTime) as a whole-second metav1.Time."""
    return f"{stamp[:19]}Z" if stamp and len(stamp) >= 19 else ""


def first_seen(event: dict[str, Any]) -> str:
    return _second(event.get("firstTimestamp") or event.get("eventTime")
                   or (event.get("metadata") or {}).get("creationTimestamp")) \
        or format_time()


def last_seen(event: dict[str, Any]) -> str:
    return _second((event.get("series") or {}).get("lastObservedTime")
                   or event.get("lastTimestamp") or event.get("eventTime")
                   or (event.get("metadata") or {}).get("creationTimestamp")) \
        or format_time()


def _by_name(name: str, tail: re.Pattern, is_copy: Callable[[str], bool]) -> str | None:
    """The longest ``<copy>-<tail>`` reading of ``name`` whose copy exists."""
    for at in [i for i, ch in enumerate(name) if ch == "-"][::-1]:
        if tail.fullmatch(name[at + 1:]) and is_copy(name[:at]):
            return name[:at]
    return None


def job_name(event: dict[str, Any], copy_named: Callable[[str, str], dict | None],
             pod_job: Callable[[str, str], str | None]) -> str | None:
    """The name of the TrainJob (copy) a worker Event's object belongs to, or None: the
    TrainJob and its JobSet by their name, a Pod by its jobset-name label (``pod_job``:
    None when the Pod is not cached) or else its name, a Job by its name."""
    involved = event.get("involvedObject") or {}
    namespace = involved.get("namespace") or (event.get("metadata") or {}).get("namespace")
    kind, name = involved.get("kind"), involved.get("name") or ""

    def exists(job: str) -> bool:
        return copy_named(namespace, job) is not None

    if kind in (c.TRAINJOB_KIND, c.JOBSET_KIND):
        return name or None
    if kind == "Job":
        return _by_name(name, _JOB_TAIL, exists)
    if kind == "Pod":
        label = pod_job(namespace, name)
        return (label or None) if label is not None else _by_name(name, _POD_TAIL, exists)
    return None


class CopyOwners(Protocol):
    """Which manager job a worker's copy stands for: the one rule that differs between the
    modes."""

    def owner(self, worker: str, copy: dict[str, Any]) -> JobRef | None:
        """The manager job ``copy`` (a TrainJob in ``worker``'s cache of copies, or one
        deleted lately) is the copy of, when that job runs on ``worker``; else None."""

    def placed(self, job: JobRef, worker: str) -> bool:
        """Whether ``job`` (that very object) still runs on ``worker``."""


def attribute(event: dict[str, Any], worker: str,
              copy_named: Callable[[str, str], dict | None],
              pod_job: Callable[[str, str], str | None],
              owners: CopyOwners) -> JobRef | None:
    """The manager job a worker's Warning Event is shown on, or None: only about a copy
    (``copy_named``: the worker's copy by namespace and name, lately deleted ones too)
    that ``owners`` says stands for a manager job running on ``worker``, and no older than
    that copy (an earlier job of the same name leaves its Events behind)."""
    name = job_name(event, copy_named, pod_job)
    if not name:
        return None
    involved = event.get("involvedObject") or {}
    namespace = involved.get("namespace") or (event.get("metadata") or {}).get("namespace")
    copy = copy_named(namespace, name)
    if copy is None:
        return None
    if involved.get("kind") == c.TRAINJOB_KIND and involved.get("uid") and \
            involved["uid"] != copy["metadata"].get("uid"):
        return None
    made = parse_time(copy["metadata"].get("creationTimestamp"))
    said = parse_time((event.get("metadata") or {}).get("creationTimestamp"))
    if made is not None and said is not None and said < made:
        return None
    return owners.owner(worker, copy)


def manager_message(worker: str, event: dict[str, Any]) -> str:
    """``worker-1: Pod my-job-node-0-0-abcde: 0/3 nodes are available: ...``"""
    involved = event.get("involvedObject") or {}
    return (f"{worker}: {involved.get('kind')} {involved.get('name')}: "
            f"{event.get('message') or ''}")[:MESSAGE_LIMIT]


def limited_message(worker: str, namespace: str, per_minute: int) -> str:
    return (f"{worker}: more than {per_minute} distinct Warning Events a minute about this "
            "job's objects; the occurrences of the rest are counted here, not shown "
            f"(`kubectl get events -n {namespace}` on {worker} lists them)")


GroupKey = tuple[JobRef, str, str, str]  # job, worker, reason, message


@dataclass
class Group:
    """One manager Event: what it shows and how far it is written."""

    job: JobRef
    worker: str
    reason: str
    message: str
    count: int = 0  # occurrences seen
    written: int = 0  # occurrences the manager Event says
    first: str = ""
    last: str = ""
    event: str | None = None  # the manager Event's name, once made or found
    limited: bool = False  # over the limit: its occurrences go to the job's REASON_LIMITED
    changed: float = 0.0


@dataclass(frozen=True)
class Write:
    """A manager Event to create (``name`` None) or to raise to ``count``."""

    key: GroupKey
    name: str | None
    job: JobRef
    reason: str
    message: str
    count: int
    new: int  # occurrences this write adds
    first: str
    last: str
    limited: bool  # the REASON_LIMITED Event


# (reason, message) -> (name, count) of the manager Events this dispatcher wrote on a job
Existing = dict[tuple[str, str], tuple[str, int]]


class Aggregation:
    """The occurrences of worker Events counted into manager Events. Informer threads
    ``observe``; one writer takes what is ``due``, ``plan``s each write and says how it
    went (``done``, ``lost``, ``retry``, ``drop``)."""

    def __init__(self, per_minute: int = MAX_NEW_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[GroupKey, Group] = {}
        self._dirty: dict[GroupKey, None] = {}  # in the order they changed
        # (worker, namespace, name) of a worker Event -> (occurrences counted, when)
        self._seen: dict[tuple[str, str, str], tuple[int, float]] = {}
        self._made: dict[JobRef, deque[float]] = {}  # creations in the window, per job

    # --- informer threads ----------------------------------------------------------

    def observe(self, worker: str, job: JobRef, event: dict[str, Any]) -> bool:
        """Count what ``event`` adds to what was seen of it; True when a write is due."""
        meta = event.get("metadata") or {}
        seen_key = (worker, meta.get("namespace") or "", meta.get("name") or "")
        now = self._clock()
        with self._lock:
            before = self._seen.get(seen_key, (0, 0.0))[0]
            now_count = occurrences(event)
            self._seen[seen_key] = (max(before, now_count), now)
            added = now_count - before
            if added <= 0:
                return False
            group = self._group(job, worker, event.get("reason") or "",
                                manager_message(worker, event), now)
            if group.limited:
                group = self._limited_group(job, worker, now)
            group.count += added
            group.first = group.first or first_seen(event)
            group.last = max(group.last, last_seen(event))
            group.changed = now
            self._dirty[self._key(group)] = None
            return True

    def forget(self, worker: str, event: dict[str, Any]) -> None:
        """The worker's Event is gone (its TTL): nothing more will come of it."""
        meta = event.get("metadata") or {}
        with self._lock:
            self._seen.pop((worker, meta.get("namespace") or "", meta.get("name") or ""), None)

    # --- the writer -------------------------------------------------------------------

    def due(self) -> list[GroupKey]:
        """The groups changed since last asked."""
        with self._lock:
            keys, self._dirty = list(self._dirty), {}
        return keys

    def pending(self) -> bool:
        """Whether a group changed since ``due`` was last asked (a write's plan can change
        another: the job's REASON_LIMITED Event)."""
        with self._lock:
            return bool(self._dirty)

    def unwritten(self, key: GroupKey) -> JobRef | None:
        """The job of a group with no manager Event yet: its existing Events are needed
        before ``plan`` (one of them may be this group's, written before a restart or by
        the replica that led before)."""
        with self._lock:
            group = self._groups.get(key)
            return group.job if group is not None and group.event is None \
                and not group.limited else None

    def plan(self, key: GroupKey, existing: Existing | None = None) -> Write | None:
        """The write ``key``'s group needs now, if any. A group with no manager Event
        takes over an existing one of the same reason and message; else it is created if
        the job's limit allows, or counted in the job's REASON_LIMITED Event from now on."""
        now = self._clock()
        with self._lock:
            group = self._groups.get(key)
            if group is None or group.limited:
                return None
            if group.event is None:
                found = (existing or {}).get((group.reason, group.message))
                if found is not None:
                    group.event, group.written = found
                    group.count = max(group.count, group.written)
                elif group.reason != REASON_LIMITED and not self._allowed(group, now):
                    group.limited = True
                    limited = self._limited_group(group.job, group.worker, now)
                    limited.count += group.count - group.written
                    limited.first = limited.first or group.first
                    limited.last = max(limited.last, group.last)
                    limited.changed = now
                    group.written = group.count
                    self._dirty[self._key(limited)] = None
                    return None
            if group.count <= group.written:
                return None
            return Write(key, group.event, group.job, group.reason, group.message,
                         group.count, group.count - group.written, group.first, group.last,
                         group.reason == REASON_LIMITED)

    def done(self, write: Write, name: str) -> None:
        """``write`` went through; ``name`` is its manager Event."""
        with self._lock:
            group = self._groups.get(write.key)
            if group is not None:
                group.event = name
                group.written = max(group.written, write.count)

    def lost(self, write: Write) -> None:
        """The manager Event is gone (expired): the next write makes it again, whole."""
        with self._lock:
            group = self._groups.get(write.key)
            if group is not None and group.event == write.name:
                group.event, group.written = None, 0
                self._dirty[write.key] = None

    def retry(self, key: GroupKey) -> None:
        with self._lock:
            if key in self._groups:
                self._dirty[key] = None

    def drop(self, write: Write) -> None:
        """``write`` cannot be made (refused): its occurrences are not shown."""
        with self._lock:
            group = self._groups.get(write.key)
            if group is not None:
                group.written = max(group.written, write.count)

    def prune(self, placed: Callable[[JobRef, str], bool]) -> set[str]:
        """Forget groups whose job is no longer ``placed(job, worker)`` or that were not
        raised for ``IDLE_SECONDS``, and worker Events not seen for twice that; the UIDs
        of the jobs still shown."""
        now = self._clock()
        with self._lock:
            for key, group in list(self._groups.items()):
                if now - group.changed > IDLE_SECONDS or not placed(group.job, group.worker):
                    del self._groups[key]
                    self._dirty.pop(key, None)
            for seen_key, (_, at) in list(self._seen.items()):
                if now - at > 2 * IDLE_SECONDS:
                    del self._seen[seen_key]
            for made_key, times in list(self._made.items()):
                while times and now - times[0] > WINDOW_SECONDS:
                    times.popleft()
                if not times:
                    del self._made[made_key]
            return {group.job.uid for group in self._groups.values()}

    def groups(self) -> list[Group]:
        with self._lock:
            return list(self._groups.values())

    # --- under the lock ---------------------------------------------------------------

    @staticmethod
    def _key(group: Group) -> GroupKey:
        return group.job, group.worker, group.reason, group.message

    def _group(self, job: JobRef, worker: str, reason: str, message: str,
               now: float) -> Group:
        key = (job, worker, reason, message)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(job, worker, reason, message, changed=now)
        return group

    def _limited_group(self, job: JobRef, worker: str, now: float) -> Group:
        return self._group(job, worker, REASON_LIMITED,
                           limited_message(worker, job.namespace, self.per_minute), now)

    def _allowed(self, group: Group, now: float) -> bool:
        """Whether the job may have one more new manager Event now (counted if so)."""
        times = self._made.setdefault(group.job, deque())
        while times and now - times[0] > WINDOW_SECONDS:
            times.popleft()
        if len(times) >= self.per_minute:
            return False
        times.append(now)
        return True
