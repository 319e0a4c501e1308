"""TrainJob status as a pure function of the TrainJob and its JobSet."""

from training_operator import status
from trainjob.api import TrainJob


def job(suspend=False, conditions=()):
    return TrainJob.model_validate({
        "metadata": {"name": "j", "namespace": "n"},
        "spec": {"runtimeRef": {"name": "r"}, "suspend": suspend},
        "status": {"conditions": list(conditions)},
    })


def test_suspend_then_resume_reasons():
    suspended, transitions = status.desired_status(job(suspend=True), None)
    assert [(c["type"], c["status"], c["reason"]) for c in suspended["conditions"]] == [
        ("Suspended", "True", "Suspended")]
    assert transitions[0].reason == "Suspended"
    resumed, _ = status.desired_status(job(conditions=suspended["conditions"]), None)
    assert [(c["type"], c["status"], c["reason"]) for c in resumed["conditions"]] == [
        ("Suspended", "False", "Resumed")]


def test_never_suspended_job_has_no_suspended_condition():
    desired, transitions = status.desired_status(job(), {"status": {}})
    assert desired["conditions"] == [] and transitions == []


def test_a_jobset_that_reported_no_job_leaves_jobs_status_out():
    desired, _ = status.desired_status(job(suspend=True), {"status": {}})
    assert "jobsStatus" not in desired


def test_jobset_completed_and_failed_carry_reason_and_message():
    jobset = {"status": {"conditions": [
        {"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": "done"}],
        "replicatedJobsStatus": [{"name": "node", "succeeded": 3}]}}
    desired, _ = status.desired_status(job(), jobset)
    assert {"type": "Complete", "status": "True", "reason": "AllJobsCompleted",
            "message": "done"}.items() <= desired["conditions"][0].items()
    assert desired["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 3, "failed": 0, "active": 0, "suspended": 0}]


def test_recomputing_the_same_world_changes_nothing():
    jobset = {"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "x"}]}}
    first, _ = status.desired_status(job(suspend=True), jobset)
    again, transitions = status.desired_status(job(suspend=True, conditions=first["conditions"]),
                                               jobset)
    assert transitions == []
    assert status.same_status(first, again)
    assert again["conditions"] == first["conditions"]  # timestamps kept


def test_the_status_command_says_dispatched_only_once_the_copy_reported():
    from dispatcher.job_state import job_state
    from trainjob import constants as c

    placed = {"metadata": {"annotations": {c.PLACEMENT_ANNOTATION: "worker-1"}},
              "spec": {}, "status": {}}
    assert job_state(placed) == "Placed (no copy reported yet)"
    reported = {**placed, "status": {"conditions": [
        {"type": "Created", "status": "True", "reason": "JobSetCreated"}]}}
    assert job_state(reported) == "Dispatched"
    assert job_state({"metadata": {}, "spec": {}}) == "Waiting"
