"""The steps ``decisions.decide`` can choose for a manager TrainJob in standalone mode,
and what it reads about the job's worker (``WorkerState``) and the configuration
(``Settings``). The reconciler performs each action.

``Action``, ``Ignore`` and ``Forget`` are the vocabulary both modes share
(``dispatcher/actions.py``); the steps here are standalone mode's own. Actions that end a
job's claim on its worker's room carry ``release``: the reconciler drops the job's capacity
reservation there before performing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The shared steps, read from here with standalone mode's own (``decisions.<Action>``).
from dispatcher.actions import Action as Action
from dispatcher.actions import Forget as Forget
from dispatcher.actions import Ignore as Ignore
from trainjob import conditions
from trainjob import constants as c

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
    retention: float  # every finished copy is kept at least this long
    failed_retention: float = 0.0  # and a Failed one at least this long

    def kept_for(self, copy: Obj) -> float:
        """How long after it finished ``copy`` stays on its worker."""
        if conditions.is_true(copy, c.CONDITION_FAILED):
            return max(self.retention, self.failed_retention)
        return self.retention


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
