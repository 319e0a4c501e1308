"""``spec.activeDeadlineSeconds``: how long a TrainJob may run before it fails with reason
``DeadlineExceeded`` (upstream Trainer v2.3's rule, like a Job's).

The clock starts at the job's creation, or again when it was last resumed (the time its
``Suspended`` condition turned False); a suspended or finished job has no deadline.
"""

from __future__ import annotations

import datetime
from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob

REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
MESSAGE_DEADLINE_EXCEEDED = "TrainJob exceeded its active deadline"


def seconds_left(job: TrainJob, raw: dict[str, Any],
                 now: datetime.datetime | None = None) -> float | None:
    """Seconds until ``job`` exceeds its deadline (<= 0: exceeded); None when none applies."""
    if not job.spec.active_deadline_seconds or job.spec.suspend or job.finished:
        return None
    started = _parse((raw.get("metadata") or {}).get("creationTimestamp"))
    resumed = job.condition(c.CONDITION_SUSPENDED)
    if resumed is not None and resumed.status == "False":
        started = _parse(resumed.last_transition_time) or started
    if started is None:
        return None
    now = now or datetime.datetime.now(datetime.UTC)
    return job.spec.active_deadline_seconds - (now - started).total_seconds()


def _parse(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
