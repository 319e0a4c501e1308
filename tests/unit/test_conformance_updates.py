"""The update half of conformance cases (pure pieces): which rows hold admission answers,
when a TrainJob reports a job active, and that an update's refusal compares by meaning like a
create's."""

from clusters.conformance import report, updated, updates
from clusters.conformance.objects import Case
from clusters.conformance.run import compare_case

FORBIDDEN_PATCHES = {"allowed": False, "causes": [["spec.runtimePatches", "Forbidden"]],
                     "code": 403, "message": "upstream's words"}


def test_update_answers_are_labelled_after_the_case_and_count_as_answers():
    case = Case("cf-x", "update", {"metadata": {"name": "cf-x"}}, update={"spec": {}})
    assert updates.label(case) == "update cf-x"
    assert updates.is_answer("update cf-x") and updates.is_answer("admission cf-x")
    assert not updates.is_answer("JobSet") and not updates.is_answer("updated")


def test_a_trainjob_reports_a_job_active_once_its_controller_copied_the_jobsets_status():
    assert updates.reported_active(None) == []
    assert updates.reported_active({"status": {"conditions": []}}) == []
    status = {"jobsStatus": [{"name": "init", "active": 0, "succeeded": 1},
                             {"name": "node", "active": 2, "ready": 0}]}
    assert updates.reported_active({"status": status}) == ["node"]


def test_an_update_refused_alike_in_other_words_is_equal_and_counts_as_a_refusal():
    case = Case("cf-x", "update")
    operator = {**FORBIDDEN_PATCHES, "code": 422, "message": "the operator's words"}
    rows = compare_case(case, {"update cf-x": FORBIDDEN_PATCHES}, {"update cf-x": operator})
    assert [(r.label, r.paths) for r in rows] == [("update cf-x", [])]
    assert report.refused(rows[0])


def test_an_update_admitted_by_one_side_only_differs_in_allowed():
    rows = compare_case(Case("cf-x", "update"), {"update cf-x": FORBIDDEN_PATCHES},
                        {"update cf-x": {"allowed": True}})
    assert rows[0].paths == ["allowed"]


def test_every_update_case_creates_a_job_and_changes_only_its_spec():
    for case in updated.update_cases():
        assert case.job is not None and case.job["metadata"]["name"] == case.name, case.name
        assert set(case.update) == {"spec"} and case.update["spec"], case.name


def test_a_job_counts_as_suspended_once_its_controller_says_so():
    assert not updates.suspended(None) and not updates.suspended({"status": {}})
    said = {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}}
    resumed = {"status": {"conditions": [{"type": "Suspended", "status": "False"}]}}
    assert updates.suspended(said) and not updates.suspended(resumed)
