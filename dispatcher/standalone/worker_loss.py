"""Worker loss, job by job (pure): what happens to a job whose worker stops answering or
leaves the registry. ``decisions.decide`` hands such a job here.

* An unreachable worker's jobs keep their last status and say so (``WorkerReachable=False``);
  after the worker-lost timeout each is placed elsewhere (``WorkerLost``). A copy left on
  the lost worker is removed by the garbage collector once it answers again.
* A worker that left the registry (kept connected while it drains, see
  ``workers/draining.py``): its copies are deleted there, and a job is placed elsewhere
  only once that is confirmed, or after the worker-lost timeout when nothing can confirm
  it (``WorkerRemoved``).

Which workers answer is the registry's business (``workers/probing.py``).
"""

from __future__ import annotations

from controller_kit.api_time import format_time, parse_time
from dispatcher.standalone import mirror
from dispatcher.standalone.actions import (
    Action,
    DeleteRemote,
    Ignore,
    MarkRemoved,
    MarkUnreachable,
    Obj,
    RemoveFinalizer,
    Replace,
    Settings,
    Wait,
    WorkerState,
)
from trainjob import conditions
from trainjob import constants as c
from trainjob.conditions import find


def drain(manager: Obj, worker: WorkerState, now: float, settings: Settings) -> Action:
    """The worker left the registry. The copy there is deleted, and the job is placed
    elsewhere only once the deletion is confirmed (the reachable worker's cache no longer
    holds it), so it never runs on two workers. A worker that cannot be reached (or is not
    known at all) cannot confirm: the job waits for the worker-lost timeout, counted from
    the condition that says so, then moves as from a lost worker."""
    finished = conditions.finished(manager)
    reachable = worker.known and worker.active
    remote = worker.remote if reachable else None
    noted = find(manager, c.CONDITION_WORKER_REACHABLE) or {}
    removed_noted = noted.get("reason") == c.REASON_WORKER_REMOVED
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
        return Replace(release=True, reason=c.REASON_WORKER_REMOVED,
                       message=f"worker {worker.name} left the registry; its copy there "
                               "is deleted")
    if not removed_noted:
        return MarkRemoved(release=True, message=(
            f"worker {worker.name} left the registry and cannot be reached to delete the "
            "copy there; the job is placed elsewhere after the worker-lost timeout"))
    waited = now - (parse_time(noted.get("lastTransitionTime")) or now)
    timeout = settings.worker_lost_timeout
    if waited >= timeout:
        return Replace(release=True, reason=c.REASON_WORKER_REMOVED,
                       message=f"worker {worker.name} left the registry and was not reachable "
                               f"for {waited:.0f}s (worker-lost timeout {timeout:.0f}s)")
    return Wait(release=True, seconds=timeout - waited,
                why=f"worker {worker.name} left the registry; waiting for the worker-lost "
                    "timeout")


def unreachable_since(manager: Obj, worker: WorkerState) -> float:
    """Since when the job's worker has been unreachable: the earlier of what this process
    saw and what the job's own ``WorkerReachable=False`` says. That condition is cleared
    as soon as the worker answers, so one still there was written in this outage, perhaps
    by an earlier process: a dispatcher started again (a failover, a crash) goes on with
    the worker-lost timeout instead of starting it over, which one restarting more often
    than the timeout would do for ever."""
    since = worker.inactive_since
    shown = find(manager, c.CONDITION_WORKER_REACHABLE) or {}
    if shown.get("status") == "False" and shown.get("reason") == c.REASON_WORKER_UNREACHABLE:
        noted = parse_time(shown.get("lastTransitionTime"))
        if noted is not None:
            since = min(since, noted)
    return since


def unreachable(manager: Obj, worker: WorkerState, now: float, settings: Settings) -> Action:
    """Keep the last status and say so; after the worker-lost timeout, place the job
    elsewhere. A copy left on the lost worker is removed by the garbage collector once it
    answers again (if it was only partitioned, that copy may have kept running)."""
    if conditions.finished(manager):
        return Ignore(why="finished")
    since = unreachable_since(manager, worker)
    lost_for = now - since
    timeout = settings.worker_lost_timeout
    if lost_for >= timeout:
        return Replace(release=True, reason=c.REASON_WORKER_LOST,
                       message=f"worker {worker.name} unreachable for {lost_for:.0f}s "
                               f"(worker-lost timeout {timeout:.0f}s)")
    shown = find(manager, c.CONDITION_WORKER_REACHABLE)
    if shown is None or shown.get("status") != "False":
        return MarkUnreachable(
            message=f"worker {worker.name} unreachable since "
                    f"{format_time(since)}: {worker.message}",
            since=since, wait=timeout - lost_for)
    return Wait(seconds=timeout - lost_for, why="waiting for the worker-lost timeout")
