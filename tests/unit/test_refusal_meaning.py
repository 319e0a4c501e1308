"""Reading what a refusal means (its fields and reason kinds) from an API Status, and
comparing two refusals by meaning rather than wording (pure)."""

from clusters.conformance.refusal import answer, causes, differences, parse_message

DENIED = 'admission webhook "validate.example.com" denied the request: '


def test_causes_come_from_the_status_details_when_present():
    status = {"kind": "Status", "code": 422, "reason": "Invalid",
              "message": 'TrainJob.trainer.kubeflow.org "j" is invalid: spec.trainer.numNodes: '
                         "Invalid value: 0: should be at least 1",
              "details": {"causes": [{"reason": "FieldValueInvalid",
                                      "field": "spec.trainer.numNodes",
                                      "message": "Invalid value: 0: should be at least 1"}]}}
    assert causes(status) == [("spec.trainer.numNodes", "Invalid")]


def test_every_cause_reason_has_a_kind():
    reasons = {"FieldValueRequired": "Required", "FieldValueNotSupported": "NotSupported",
               "FieldValueForbidden": "Forbidden", "FieldValueDuplicate": "Duplicate",
               "FieldValueNotFound": "NotFound", "FieldValueTooLong": "TooLong",
               "FieldValueTypeInvalid": "Invalid", "InternalError": "Internal"}
    for reason, kind in reasons.items():
        status = {"details": {"causes": [{"reason": reason, "field": "spec.a"}]}}
        assert causes(status) == [("spec.a", kind)], reason


def test_without_details_one_error_is_parsed_from_the_message():
    status = {"code": 403, "reason": "Forbidden",
              "message": DENIED + 'spec.trainer.env: Invalid value: [{"name":"X"}]: reserved'}
    assert causes(status) == [("spec.trainer.env", "Invalid")]


def test_an_aggregate_of_errors_is_parsed_in_full():
    message = DENIED + ("[spec.trainer.env[0]: Forbidden: A is reserved, "
                        "spec.trainer.env[2]: Forbidden: B is reserved, "
                        "spec.runtimePatches.manager: Required value, "
                        "metadata.labels[example.com/x]: Too long: may not be more than 63]")
    assert parse_message(message) == [("spec.trainer.env[0]", "Forbidden"),
                                      ("spec.trainer.env[2]", "Forbidden"),
                                      ("spec.runtimePatches.manager", "Required"),
                                      ("metadata.labels[example.com/x]", "TooLong")]


def test_every_error_type_word_is_read():
    words = {"Invalid value": "Invalid", "Required value": "Required",
             "Unsupported value": "NotSupported", "Forbidden": "Forbidden",
             "Duplicate value": "Duplicate", "Not found": "NotFound", "Too long": "TooLong",
             "Too many": "TooMany", "Internal error": "Internal"}
    for word, kind in words.items():
        assert parse_message(f"{DENIED}spec.a: {word}: why") == [("spec.a", kind)], word
    assert parse_message(f"{DENIED}spec.a: Required value") == [("spec.a", "Required")]


def test_text_inside_a_value_or_reason_is_not_taken_for_an_error():
    message = DENIED + ('spec.runtimeRef: Invalid value: {"name":"x"}: runtime x not found; '
                        "see spec.trainer for the trainer settings")
    assert parse_message(message) == [("spec.runtimeRef", "Invalid")]


def test_field_spelling_is_normalised():
    # A Go field name in a path is the JSON field; "<nil>" is a rule on the whole object.
    assert causes({"message": DENIED + "spec.RuntimeRef: Invalid value: x: not found"}) == [
        ("spec.runtimeRef", "Invalid")]
    assert causes({"details": {"causes": [{"reason": "FieldValueInvalid",
                                           "field": "<nil>"}]}}) == [("", "Invalid")]


def test_a_refusal_naming_no_field_keeps_its_status_reason():
    status = {"code": 403, "reason": "Forbidden",
              "message": DENIED + "unsupported runtime: example.com/Other"}
    assert causes(status) == [("", "Forbidden")]
    assert causes(None) == [("", "Unknown")]


def test_repeated_causes_count_once_and_sort():
    message = DENIED + "[spec.b: Invalid value: 1: x, spec.a: Invalid value: 2: y, " \
                       "spec.b: Invalid value: 3: z]"
    assert causes({"message": message}) == [("spec.a", "Invalid"), ("spec.b", "Invalid")]


def test_the_answer_keeps_wording_beside_the_meaning():
    recorded = answer({"message": DENIED + "spec.a: Forbidden: no"}, 403)
    assert recorded == {"allowed": False, "causes": [["spec.a", "Forbidden"]], "code": 403,
                        "message": DENIED + "spec.a: Forbidden: no"}


def test_same_meaning_in_other_words_and_codes_is_no_difference():
    webhook = answer({"code": 403, "reason": "Forbidden",
                      "message": DENIED + "spec.trainer.numNodes: Invalid value: 0: too few"}, 403)
    schema = answer({"code": 422, "reason": "Invalid", "message": "is invalid: ...",
                     "details": {"causes": [{"reason": "FieldValueInvalid",
                                             "field": "spec.trainer.numNodes"}]}}, 422)
    assert differences(webhook, schema) == []


def test_differences_name_the_fields_whose_reasons_differ():
    upstream = {"allowed": False, "causes": [["spec.runtimeRef", "Invalid"],
                                             ["spec.trainer.env", "Invalid"]]}
    operator = {"allowed": False, "causes": [["spec.runtimeRef", "NotFound"],
                                             ["spec.trainer.env", "Invalid"],
                                             ["metadata.name", "Invalid"]]}
    assert differences(upstream, operator) == ["causes metadata.name", "causes spec.runtimeRef"]
    assert differences({"allowed": False, "causes": [["", "Forbidden"]]},
                       {"allowed": False, "causes": []}) == ["causes (object)"]


def test_allowed_against_refused_is_one_difference():
    assert differences({"allowed": True}, {"allowed": False, "causes": [["spec.a", "Invalid"]]}) \
        == ["allowed"]
    assert differences({"allowed": True}, {"allowed": True}) == []
    assert differences(None, None) == []


def test_the_apiserver_note_about_unchecked_rules_is_not_a_cause():
    status = {"code": 422, "reason": "Invalid", "details": {"causes": [
        {"reason": "FieldValueNotSupported", "field": "spec.runtimeRef.kind",
         "message": 'Unsupported value: "Other"'},
        {"reason": "FieldValueInvalid", "field": "<nil>",
         "message": "Invalid value: null: some validation rules were not checked because the "
                    "object was invalid; correct the existing errors to complete validation"}]}}
    assert causes(status) == [("spec.runtimeRef.kind", "NotSupported")]


def test_an_intended_refusal_compares_as_the_operator_gives_it():
    from clusters.conformance.compare import refusal_as_operator_says

    upstream = {"allowed": False, "causes": [["", "Invalid"]]}
    operator = {"allowed": False, "causes": [["metadata.name", "Invalid"]]}
    assert differences(refusal_as_operator_says(upstream, operator), operator) == []
    # Only where the operator does say it: another refusal stays a difference.
    other = {"allowed": False, "causes": [["spec.trainer", "Invalid"]]}
    assert differences(refusal_as_operator_says(upstream, other), other) == [
        "causes (object)", "causes spec.trainer"]
