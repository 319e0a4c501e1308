"""What one node (one trainer pod) has, read from its resources as upstream Trainer reads
them: the number of GPUs and of CPUs, for the policies that size processes by them."""

from __future__ import annotations

from decimal import ROUND_CEILING
from typing import Any

from kubernetes.utils.quantity import parse_quantity


def gpus_per_node(resources: dict[str, Any]) -> int:
    """GPUs of one node: the first resource whose name contains "gpu", from the requests,
    else from the limits (upstream's reading)."""
    def first_gpu(amounts: dict[str, Any] | None) -> int:
        for name, amount in (amounts or {}).items():
            if "gpu" in name.lower():
                return _whole(amount)
        return 0
    return first_gpu(resources.get("requests")) or first_gpu(resources.get("limits"))


def cpus_per_node(resources: dict[str, Any]) -> int:
    """CPUs of one node, rounded up: the cpu request, else the cpu limit, else 0."""
    request = (resources.get("requests") or {}).get("cpu")
    if request is not None and parse_quantity(request) != 0:
        return _whole(request)
    limit = (resources.get("limits") or {}).get("cpu")
    return _whole(limit) if limit is not None else 0


def _whole(amount: Any) -> int:
    return int(parse_quantity(amount).to_integral_value(rounding=ROUND_CEILING))


def whole_number(value: Any) -> int | None:
    """A count such as ``numProcPerNode`` (an int, or a string of digits) as an int; None
    for anything else ("auto", "gpu", a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None
