"""The one condition rule both sides write with (trainjob.conditions.upsert), as the
dispatcher's condition writes and the operator's status use it."""

from __future__ import annotations

from training_operator.status import set_condition
from trainjob.conditions import finished, upsert


def _condition(type_: str, status: str, when: str, reason: str = "R") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": when}


def test_a_changed_status_replaces_the_condition_in_place_with_its_new_time():
    existing = [_condition("Placed", "False", "t1"), _condition("Created", "True", "t1")]
    result = upsert(existing, _condition("Placed", "True", "t2"))
    assert [(x["type"], x["status"], x["lastTransitionTime"]) for x in result] == [
        ("Placed", "True", "t2"), ("Created", "True", "t1")]
    assert existing[0]["status"] == "False", "upsert must not change the list it is given"


def test_an_unchanged_status_keeps_its_transition_time_and_a_new_type_is_appended():
    existing = [_condition("Placed", "True", "t1")]
    result = upsert(existing, _condition("Placed", "True", "t9", reason="Other"))
    assert result == [_condition("Placed", "True", "t1", reason="Other")]
    result = upsert(result, _condition("Complete", "True", "t9"))
    assert [x["type"] for x in result] == ["Placed", "Complete"]


def test_the_operator_records_a_transition_only_when_something_changed():
    conditions = [_condition("Suspended", "True", "t1", reason="Suspended")]
    transitions: list = []
    set_condition(conditions, "Suspended", "True", "Suspended", "", transitions)
    assert transitions == [] and conditions[0]["lastTransitionTime"] == "t1"
    set_condition(conditions, "Suspended", "True", "Suspended", "now a message", transitions)
    assert len(transitions) == 1 and conditions[0]["lastTransitionTime"] == "t1", (
        "a new message is a transition, but the status did not change so its time stays")
    set_condition(conditions, "Suspended", "False", "Resumed", "", transitions)
    assert len(transitions) == 2 and conditions[0]["lastTransitionTime"] != "t1"
    assert len(conditions) == 1


def test_finished_means_complete_or_failed_true():
    assert finished({"status": {"conditions": [_condition("Failed", "True", "t")]}})
    assert finished({"status": {"conditions": [_condition("Complete", "True", "t")]}})
    assert not finished({"status": {"conditions": [_condition("Complete", "False", "t")]}})
    assert not finished(None)
