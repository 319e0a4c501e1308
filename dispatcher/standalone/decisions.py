"""Standalone mode: what to do next for one manager TrainJob, a pure function of what is
observed.

``decide`` reads the manager object, the state of the worker it is placed on (with that
worker's cached copy) and the time, and returns exactly one action. The reconciler
performs it; the next event or requeue brings the job back for the next step. Because each
step is derived again from what the API objects say, a crash between two writes leaves a
state from which ``decide`` picks the same or the next step: ``decide`` itself keeps
nothing between rounds. (Placement, which ``Place`` asks the Placer for, also reads the
Placer's in-memory reservations and excluded workers; both say there what a restart loses.)

The actions are in ``actions`` and read as ``decisions.<Action>`` (the reconciler matches
on them). A job whose worker is unreachable or left the registry is decided by
``worker_loss``.
"""

from __future__ import annotations

from dispatcher.standalone import mirror, worker_loss

# Every action, those only ``worker_loss`` returns included: the reconciler and the tests
# read them as ``decisions.<Action>``.
from dispatcher.standalone.actions import (
    Action,
    CopyStatus,
    CreateRemote,
    DeleteRemote,
    Exclude,
    Forget,
    Ignore,
    InSync,
    LeaveToKueue,
    Obj,
    Place,
    RemoveFinalizer,
    Replace,
    Settings,
    Unplace,
    Wait,
    WorkerState,
)
from dispatcher.standalone.actions import MarkRemoved as MarkRemoved
from dispatcher.standalone.actions import MarkUnreachable as MarkUnreachable
from trainjob import conditions, managed_by
from trainjob import constants as c
from trainjob.conditions import find

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
        return worker_loss.drain(
            manager, worker or WorkerState(placed, known=False, active=False), now, settings)
    if not worker.active:
        return worker_loss.unreachable(manager, worker, now, settings)
    return _sync(manager, worker, now, settings)


def _teardown(manager: Obj, worker: WorkerState | None, now: float, settings: Settings,
              unplace: bool) -> Action:
    """Deleted or suspended: the copy goes first, then the placement or finalizer."""
    if worker is not None and worker.known:
        if not worker.active:
            lost_for = now - worker_loss.unreachable_since(manager, worker)
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
    remote_status = mirror.manager_status(remote.get("status") or {}, manager, worker.name, now)
    manager_status = manager.get("status") or {}
    # The worker answers (we are here): a WorkerReachable=False of ours goes at once, even
    # when the copy has no status yet to replace it with.
    unreachable_shown = find(manager, CONDITION_WORKER_REACHABLE) is not None
    if remote_status != manager_status and (remote_status or unreachable_shown):
        return CopyStatus(release=done, status=remote_status)
    if done and conditions.finished(manager):
        # From the copy's own finish time, not from when this process saw it: a restarted
        # dispatcher deletes it when its time comes, never later, never earlier.
        finished_at = conditions.finished_time(remote)
        wait = settings.kept_for(remote) - (now - finished_at) if finished_at else 0
        if wait > 0:
            return Wait(release=True, seconds=wait,
                        why="keeping the finished copy for the retention period, so its "
                            "Pods, Events and logs stay readable")
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
