"""When a TrainJob's activeDeadlineSeconds runs out (upstream Trainer v2.3's rule)."""

import datetime

from training_operator import deadline
from trainjob.api import TrainJob

CREATED = "2026-01-01T00:00:00Z"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def job(conditions=(), **spec) -> tuple[TrainJob, dict]:
    raw = {"metadata": {"name": "j", "namespace": "n", "creationTimestamp": CREATED},
           "spec": {"runtimeRef": {"name": "rt"}, **spec},
           "status": {"conditions": list(conditions)}}
    return TrainJob.model_validate(raw), raw


def test_counted_from_creation():
    assert deadline.seconds_left(*job(activeDeadlineSeconds=60),
                                 now=T0 + datetime.timedelta(seconds=45)) == 15


def test_counted_again_from_the_last_resume():
    resumed = {"type": "Suspended", "status": "False", "reason": "Resumed",
               "lastTransitionTime": "2026-01-01T00:10:00Z"}
    assert deadline.seconds_left(*job([resumed], activeDeadlineSeconds=60),
                                 now=T0 + datetime.timedelta(minutes=10, seconds=50)) == 10


def test_no_deadline_when_unset_suspended_or_finished():
    later = T0 + datetime.timedelta(days=1)
    assert deadline.seconds_left(*job(), now=later) is None
    assert deadline.seconds_left(*job(activeDeadlineSeconds=1, suspend=True), now=later) is None
    complete = {"type": "Complete", "status": "True", "reason": "Done"}
    assert deadline.seconds_left(*job([complete], activeDeadlineSeconds=1), now=later) is None
