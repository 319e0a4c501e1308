"""Admission of a Volcano runtime's priorityClassName (upstream's Volcano plug-in rule):
which names are looked up, and the refusal a missing one gets, through the whole review."""

import copy

from test_webhook_review import (
    TableLookups,
    allowed,
    causes_of,
    refused,
    replicated_job,
    runtime,
    trainjob,
)

from training_operator import priority_classes


def _volcano(*names: str | None, policy: dict | None = None) -> dict:
    jobs = []
    for i, name in enumerate(names):
        job = replicated_job("node" if i == len(names) - 1 else f"step-{i}")
        if name is not None:
            job["template"]["spec"]["template"]["spec"]["priorityClassName"] = name
        jobs.append(job)
    document = runtime("gang", jobs)
    document["spec"]["podGroupPolicy"] = {"volcano": {}} if policy is None else policy
    return document


def _lookups(document: dict, existing: set[str]) -> TableLookups:
    lookups = TableLookups()
    lookups.runtimes[("ClusterTrainingRuntime", "", "gang")] = document
    lookups.priorities = set(existing)
    return lookups


def _job() -> dict:
    return trainjob(runtimeRef={"name": "gang", "apiGroup": "trainer.kubeflow.org",
                                "kind": "ClusterTrainingRuntime"})


def test_names_are_looked_up_in_job_order_until_a_built_in_one():
    assert priority_classes.names(_volcano("high", None, "low")) == ["high", "low"]
    assert priority_classes.names(_volcano("high", "system-node-critical", "low")) == ["high"]
    assert priority_classes.names(_volcano("system-cluster-critical", "low")) == []


def test_only_a_volcano_runtime_is_checked():
    assert priority_classes.names(_volcano("high", policy={"coscheduling": {}})) == []
    no_policy = copy.deepcopy(_volcano("high"))
    del no_policy["spec"]["podGroupPolicy"]
    assert priority_classes.names(no_policy) == []
    assert priority_classes.names("garbage") == [] and priority_classes.names({}) == []


def test_a_missing_priority_class_is_refused_naming_upstreams_field():
    status = refused(_job(), lookups=_lookups(_volcano("high"), set()))
    assert causes_of(status) == [("spec.templateSpec.priorityClassName", "FieldValueInvalid")]
    assert "'high'" in status["message"] and "not found" in status["message"]


def test_an_existing_or_built_in_priority_class_is_admitted():
    allowed(_job(), lookups=_lookups(_volcano("high"), {"high"}))
    lookups = _lookups(_volcano("system-node-critical"), set())
    allowed(_job(), lookups=lookups)
    assert not [call for call in lookups.calls if call[0] == "priority_class"]


def test_a_lookup_that_fails_refuses_the_name():
    def broken(name):
        raise TimeoutError(name)

    assert priority_classes.problems(_volcano("high"), broken) == [(
        priority_classes.FIELD, "PriorityClass 'high' named by the runtime's pod template "
        "cannot be read (TimeoutError): Volcano's PodGroup would carry a priority that does not "
        "exist; create the PriorityClass first")]
