"""Per-pod requests read from a runtime's template, which the API server does not check:
a bad quantity is named by replicated job, container and field."""

from decimal import Decimal

import pytest

from trainjob.runtime.podsets import PodSet


def pod_set(resources: dict) -> PodSet:
    return PodSet("trainer", {"name": "node", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "trainer", "resources": resources}]}}}}})


def test_a_request_wins_over_its_limit():
    assert pod_set({"limits": {"cpu": "4", "memory": "1Gi"},
                    "requests": {"cpu": "500m"}}).requests == {
        "cpu": Decimal("0.5"), "memory": Decimal(2**30)}


@pytest.mark.parametrize("value", ["abc", "-1", "1.5.0Gi"])
@pytest.mark.parametrize("kind", ["requests", "limits"])
def test_a_bad_quantity_names_where_it_is(kind, value):
    with pytest.raises(ValueError) as refused:
        _ = pod_set({kind: {"cpu": value}}).requests
    assert str(refused.value) == (f"replicatedJobs[node] container trainer: resources.{kind}.cpu "
                                  f"{value!r} is not a non-negative quantity")
