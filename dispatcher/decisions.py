"""What to do next for one manager TrainJob: a pure function of what is observed.

``decide`` reads the manager object, the state of the worker it is placed on (with that
worker's cached copy) and the time, and returns exactly one action. The reconciler
performs it; the next event or requeue brings the job back for the next step. Because each
step is derived again from what the API objects say, a crash between two writes leaves a
state from which ``decide`` picks the same or the next step: ``decide`` itself keeps
nothing between rounds. (Placement, which ``Place`` asks the Placer for, also reads the
Placer's in-memory reservations and excluded workers; both say there what a restart loses.)

Actions that end a job's claim on its worker's room carry ``release``: the reconciler drops
the job's capacity reservation there before performing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher import mirror
from trainjob import conditions
from trainjob import constants as c
from trainjob import managed_by
from trainjob.conditions import find, format_time, parse_time

CONDITION_PLACED = c.CONDITION_PLACED
CONDITION_WORKER_REACHABLE = c.CONDITION_WORKER_REACHABLE
REASON_NO_WORKER = c.REASON_NO_WORKER
REASON_REMOTE_DELETED = c.REASON_REMOTE_DELETED
REASON_WORKER_UNREACHABLE = c.REASON_WORKER_UNREACHABLE
REASON_WORKER_LOST = c.REASON_WORKER_LOST
REASON_WORKER_REMOVED = c.REASON_WORKER_REMOVED
REASON_NAME_TAKEN = "NameTaken"
# Conditions the dispatcher writes itself (the rest of a manager status is the copy's).
OWN_CONDITIONS = (CONDITION_PLACED, CONDITION_WORKER_REACHABLE)
# Requeue delay after deleting a copy of an earlier same-named job: its DELETED event
# usually comes first.
STALE_COPY_RETRY = 0.2
# While a job that is being deleted waits for its unreachable worker: look again at least
# this often (the worker may answer sooner than the timeout).
TEARDOWN_RECHECK = 5.0

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkerState:
    """The worker a job is placed on, as the registry sees it now."""

    name: str
    known: bool = True  # registered, or draining (left the registry, still reachable)
    draining: bool = False
    active: bool = True
    inactive_since: float = 0.0  # wall clock of the change to inactive
    message: str = ""  # why it is inactive
    remote: Obj | None = None  # the job's copy in its cache (read only when active)


@dataclass(frozen=True)
class Settings:
    origin: str
    worker_lost_timeout: float
    retention: float


@dataclass(frozen=True)
class Action:
    release: bool = False  # drop the job's capacity reservation on its worker first

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Forget(Action):
    """The manager object is gone: drop what is kept per job (its copies are the garbage
    collector's business)."""


@dataclass(frozen=True)
class Ignore(Action):
    """Nothing to do: not ours, or nothing left to do for now."""

    why: str = ""


@dataclass(frozen=True)
class LeaveToKueue(Action):
    """Kueue runs on the manager and manages this job: never claimed (said once)."""

    why: str = ""


@dataclass(frozen=True)
class InSync(Action):
    """The manager already shows the copy's status."""


@dataclass(frozen=True)
class Place(Action):
    """Choose a worker, record it with our finalizer, create the copy there."""


@dataclass(frozen=True)
class CreateRemote(Action):
    """Placed, and the copy is missing on a reachable worker: create (or adopt) it."""


@dataclass(frozen=True)
class DeleteRemote(Action):
    remote: Obj | None = None
    why: str = ""
    retry: float | None = None  # look again after this long (else the DELETED event)


@dataclass(frozen=True)
class CopyStatus(Action):
    status: Obj | None = None


@dataclass(frozen=True)
class RemoveFinalizer(Action):
    """Nothing is left on the worker: let the manager object go (or rest, finished)."""


@dataclass(frozen=True)
class Unplace(Action):
    """Suspended: clear the placement and our finalizer; placed again on resume."""


@dataclass(frozen=True)
class Replace(Action):
    """Forget the placement and the old copy's status; the job is placed again."""

    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class MarkUnreachable(Action):
    message: str = ""
    since: float = 0.0
    wait: float = 0.0  # then wait this long for the worker-lost timeout


@dataclass(frozen=True)
class MarkRemoved(Action):
    message: str = ""


@dataclass(frozen=True)
class Exclude(Action):
    """The worker holds a same-named object that is not our copy: never touched; the job
    goes elsewhere."""

    reason: str = ""
    why: str = ""


@dataclass(frozen=True)
class Wait(Action):
    seconds: float = 0.0
    why: str = ""


def decide(manager: Obj | None, worker: WorkerState | None, now: float,
           settings: Settings, kueue_claim: str | None = None) -> Action:
    """The next step for ``manager``; ``worker`` is the worker named by its placement
    (None when it is not placed); ``kueue_claim``: why Kueue, running on the manager,
    manages the job (None: it does not)."""
    if manager is None:
        return Forget()
    if not managed_by.dispatched(manager):
        return Ignore(why="not managed by MultiKueue: never ours")
    spec = manager.get("spec") or {}
    placed = placement(manager)
    # A job placed before Kueue came is ours to finish; an unplaced one Kueue takes is not.
    if not placed and kueue_claim:
        return LeaveToKueue(why=kueue_claim)
    if manager["metadata"].get("deletionTimestamp"):
        return _teardown(manager, worker, now, settings, unplace=False)
    if spec.get("suspend"):
        return _teardown(manager, worker, now, settings, unplace=True) if placed else \
            Ignore(why="suspended")
    if not placed:
        return Ignore(why="finished") if conditions.finished(manager) else Place()
    if worker is None or not worker.known or worker.draining:
        return _drain(manager, worker or WorkerState(placed, known=False, active=False),
                      now, settings)
    if not worker.active:
        return _unreachable(manager, worker, now, settings)
    return _sync(manager, worker, now, settings)


def _teardown(manager: Obj, worker: WorkerState | None, now: float, settings: Settings,
              unplace: bool) -> Action:
    """Deleted or suspended: the copy goes first, then the placement or finalizer."""
    if worker is not None and worker.known:
        if not worker.active:
            lost_for = now - worker.inactive_since
            if lost_for < settings.worker_lost_timeout:
                return Wait(seconds=min(TEARDOWN_RECHECK,
                                        settings.worker_lost_timeout - lost_for),
                            why=f"worker {worker.name} unreachable; its copy not deleted yet")
            # Past the worker-lost timeout: let go; the garbage collector removes the
            # copy if the worker answers again.
        elif worker.remote is not None and mirror.is_ours(worker.remote, settings.origin):
            return DeleteRemote(release=True, remote=worker.remote,
                                why="its manager TrainJob is deleted or suspended")
    if unplace:
        return Unplace(release=True)
    if c.DISPATCH_FINALIZER in (manager["metadata"].get("finalizers") or []):
        return RemoveFinalizer(release=True)
    return Ignore(release=True, why="nothing left to tear down")


def _drain(manager: Obj, worker: WorkerState, now: float, settings: Settings) -> Action:
    """The worker left the registry. The copy there is deleted, and the job is placed
    elsewhere only once the deletion is confirmed (the reachable worker's cache no longer
    holds it), so it never runs on two workers. A worker that cannot be reached (or is not
    known at all) cannot confirm: the job waits for the worker-lost timeout, counted from
    the condition that says so, then moves as from a lost worker."""
    finished = conditions.finished(manager)
    reachable = worker.known and worker.active
    remote = worker.remote if reachable else None
    noted = find(manager, CONDITION_WORKER_REACHABLE) or {}
    removed_noted = noted.get("reason") == REASON_WORKER_REMOVED
    if remote is not None and mirror.mirrors(remote, manager):
        if not finished and not removed_noted:
            return MarkRemoved(release=True, message=(
                f"worker {worker.name} left the registry; deleting the copy there before "
                "placing the job elsewhere"))
        return DeleteRemote(release=True, remote=remote,
                            why=f"worker {worker.name} left the registry")
    if finished:
        if reachable and c.DISPATCH_FINALIZER in (manager["metadata"].get("finalizers") or []):
            return RemoveFinalizer(release=True)  # nothing of it is left there
        return Ignore(release=True, why="finished")
    if reachable:
        return Replace(release=True, reason=REASON_WORKER_REMOVED,
                       message=f"worker {worker.name} left the registry; its copy there "
                               "is deleted")
    if not removed_noted:
        return MarkRemoved(release=True, message=(
            f"worker {worker.name} left the registry and cannot be reached to delete the "
            "copy there; the job is placed elsewhere after the worker-lost timeout"))
    waited = now - (parse_time(noted.get("lastTransitionTime")) or now)
    timeout = settings.worker_lost_timeout
    if waited >= timeout:
        return Replace(release=True, reason=REASON_WORKER_REMOVED,
                       message=f"worker {worker.name} left the registry and was not reachable "
                               f"for {waited:.0f}s (worker-lost timeout {timeout:.0f}s)")
    return Wait(release=True, seconds=timeout - waited,
                why=f"worker {worker.name} left the registry; waiting for the worker-lost "
                    "timeout")


def _unreachable(manager: Obj, worker: WorkerState, now: float, settings: Settings) -> Action:
    """Keep the last status and say so; after the worker-lost timeout, place the job
    elsewhere. A copy left on the lost worker is removed by the garbage collector once it
    answers again (if it was only partitioned, that copy may have kept running)."""
    if conditions.finished(manager):
        return Ignore(why="finished")
    lost_for = now - worker.inactive_since
    timeout = settings.worker_lost_timeout
    if lost_for >= timeout:
        return Replace(release=True, reason=REASON_WORKER_LOST,
                       message=f"worker {worker.name} unreachable for {lost_for:.0f}s "
                               f"(worker-lost timeout {timeout:.0f}s)")
    shown = find(manager, CONDITION_WORKER_REACHABLE)
    if shown is None or shown.get("status") != "False":
        return MarkUnreachable(
            message=f"worker {worker.name} unreachable since "
                    f"{format_time(worker.inactive_since)}: {worker.message}",
            since=worker.inactive_since, wait=timeout - lost_for)
    return Wait(seconds=timeout - lost_for, why="waiting for the worker-lost timeout")


def _sync(manager: Obj, worker: WorkerState, now: float, settings: Settings) -> Action:
    """The steady state: the copy exists and its status is mirrored; a finished copy is
    deleted after the retention period, then the finalizer goes."""
    remote = worker.remote
    if remote is not None and not mirror.is_ours(remote, settings.origin):
        return Exclude(release=True, reason=REASON_NAME_TAKEN,
                       why=f"TrainJob {_key(manager)} exists there and is not a copy made by "
                           "this dispatcher")
    if remote is not None and not mirror.mirrors(remote, manager):
        return DeleteRemote(remote=remote, why="a copy of an earlier job of the same name",
                            retry=STALE_COPY_RETRY)
    if remote is None:
        if conditions.finished(manager):
            if c.DISPATCH_FINALIZER in (manager["metadata"].get("finalizers") or []):
                return RemoveFinalizer(release=True)
            return Ignore(release=True, why="finished; its copy is gone")
        if (manager.get("status") or {}).get("conditions") and not only_own_conditions(manager):
            # It had reported status, so it existed: someone deleted it while it ran.
            return Replace(release=True, reason=REASON_REMOTE_DELETED,
                           message=f"the copy on {worker.name} was deleted by someone else")
        return CreateRemote()
    done = conditions.finished(remote)
    remote_status = remote.get("status") or {}
    manager_status = manager.get("status") or {}
    # The worker answers (we are here): a WorkerReachable=False of ours goes at once, even
    # when the copy has no status yet to replace it with.
    unreachable_shown = find(manager, CONDITION_WORKER_REACHABLE) is not None
    if remote_status != manager_status and (remote_status or unreachable_shown):
        return CopyStatus(release=done, status=remote_status)
    if done and conditions.finished(manager):
        finished_at = conditions.finished_time(remote)
        wait = settings.retention - (now - finished_at) if finished_at else 0
        if wait > 0:
            return Wait(release=True, seconds=wait,
                        why="keeping the finished copy for the retention period")
        return DeleteRemote(release=True, remote=remote, why="finished, retention over")
    return InSync(release=done)


# --- reading objects -------------------------------------------------------------------

def placement(manager: Obj) -> str | None:
    return (manager["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION) or None


def only_own_conditions(manager: Obj) -> bool:
    """The manager status holds only the dispatcher's own conditions."""
    return all(x.get("type") in OWN_CONDITIONS for x in conditions.conditions(manager))


def _key(manager: Obj) -> str:
    return f"{manager['metadata'].get('namespace')}/{manager['metadata'].get('name')}"
