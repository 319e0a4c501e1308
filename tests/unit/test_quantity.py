"""Quantities printed the way Kubernetes prints them back (the strings upstream writes into
PodGroups), and a gang's requests summed the way upstream sums them."""

from __future__ import annotations

from decimal import Decimal

import pytest

from trainjob.quantity import BINARY_SI, DECIMAL_EXPONENT, DECIMAL_SI, Quantity, canonical
from trainjob.runtime.podsets import PodSet, group_resources


@pytest.mark.parametrize("text, times, expected", [
    ("2Gi", 4, "8Gi"), ("1536Mi", 2, "3Gi"), ("1536", 1, "1536"), ("1Ki", 1, "1Ki"),
    ("512Ki", 1, "512Ki"), ("1", 4, "4"), ("500m", 3, "1500m"), ("1.5", 1, "1500m"),
    ("2000", 1, "2k"), ("1G", 8, "8G"), ("100M", 30, "3G"), ("0.1", 1, "100m"),
    ("1e3", 2, "2e3"), ("0", 5, "0"), ("1.5Gi", 1, "1536Mi"), ("0.5Ki", 1, "512"),
])
def test_printed_as_kubernetes_prints_it(text, times, expected):
    assert str(Quantity.parse(text).times(times)) == expected


def test_a_sum_keeps_the_format_of_its_first_term():
    # 2**30 + 10**9 bytes is no whole number of Ki: printed plain, still BinarySI.
    assert (Quantity.parse("1Gi") + Quantity.parse("1G")).format == BINARY_SI
    assert str(Quantity.parse("1Gi") + Quantity.parse("1G")) == "2073741824"
    assert str(Quantity.parse("1Gi") + Quantity.parse("1Gi")) == "2Gi"
    assert (Quantity.parse("1G") + Quantity.parse("1Gi")).format == DECIMAL_SI
    assert (Quantity(Decimal(0)) + Quantity.parse("4Gi")).format == BINARY_SI


def test_tiny_amounts_round_up_to_nano_units():
    assert canonical(Decimal("0.0000000001"), DECIMAL_SI) == "1n"
    assert canonical(Decimal("1000000"), DECIMAL_EXPONENT) == "1e6"


def _pod_set(count: int, containers: list[dict], init: list[dict] | None = None) -> PodSet:
    spec = {"containers": containers, **({"initContainers": init} if init else {})}
    return PodSet("trainer", {"name": "node", "replicas": 1, "template": {"spec": {
        "parallelism": count, "template": {"spec": spec}}}})


def _requests(**amounts) -> dict:
    return {"resources": {"requests": amounts}}


def test_group_resources_sum_declared_requests_only():
    node = _pod_set(4, [{"name": "a", **_requests(cpu="1", memory="2Gi")},
                        {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    assert group_resources([node]) == {"cpu": "4", "memory": "8Gi"}


def test_group_resources_count_sidecars_and_floor_init_containers():
    pod = _pod_set(2, [{"name": "main", **_requests(cpu="1")}], init=[
        {"name": "side", "restartPolicy": "Always", **_requests(cpu="500m")},
        {"name": "setup", **_requests(cpu="3", memory="1Gi")}])
    # main + sidecar = 1.5 cpu, but setup runs with the sidecar: 3.5 cpu is the floor.
    assert group_resources([pod]) == {"cpu": "7", "memory": "2Gi"}
