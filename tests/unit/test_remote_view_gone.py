"""What the remote view says of a finished job whose copy is gone from its worker: where
it ran, when it finished, how long its copy was kept and which setting keeps it longer
(standalone mode), or that Kueue deleted it (Kueue mode)."""

from __future__ import annotations

from controller_kit.api_time import format_time
from dispatcher.remote_view.copies import Keeping, gone_message
from trainjob import constants as c

NOW = 2_000_000_000.0


def job(finished: str = c.CONDITION_FAILED, seconds_ago: float = 1000.0) -> dict:
    return {"metadata": {"namespace": "team-a", "name": "llm"},
            "status": {"conditions": [{"type": finished, "status": "True",
                                       "lastTransitionTime": format_time(NOW - seconds_ago)}]}}


def test_a_failed_jobs_copy_deleted_after_its_retention_names_the_worker_and_the_flag():
    said = gone_message(job(), "worker-1", Keeping(retention=0, failed_retention=900), NOW)
    assert said.startswith(f"TrainJob team-a/llm: Failed at {format_time(NOW - 1000)}; its "
                           "copy on worker worker-1, with its Pods, their Events and logs, "
                           "was deleted 900s after it finished (the dispatcher's "
                           "--failed-retention, now 900s"), said
    assert "kubectl describe trainjob" in said


def test_a_completed_jobs_copy_is_told_deleted_at_once_and_the_flag_that_keeps_it():
    said = gone_message(job(c.CONDITION_COMPLETE), "worker-2",
                        Keeping(retention=0, failed_retention=900), NOW)
    assert "Complete at" in said and "was deleted as soon as it finished" in said and \
        "the dispatcher's --retention, now 0s" in said, said


def test_a_copy_gone_before_its_time_is_not_told_as_the_retentions_doing():
    said = gone_message(job(seconds_ago=10), "worker-1",
                        Keeping(retention=0, failed_retention=900), NOW)
    assert f"was deleted before the 900s the dispatcher keeps it (until " \
           f"{format_time(NOW + 890)}), by someone else" in said, said


def test_in_kueue_mode_kueue_is_said_to_have_deleted_it():
    said = gone_message(job(), None, Keeping(by_kueue=True), NOW)
    assert "Kueue's MultiKueue deleted its copy on its worker" in said and \
        "--retention" not in said, said
