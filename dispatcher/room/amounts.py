"""Resource amounts: whether a pod fits a Node's room, and how messages word amounts (pure).

Its own module because the capacity picture (``capacity``), the check of arrival orders
(``arrival``) and the choice of a worker (``chooser``) all use them: kept in one of them,
they would import each other.
"""

from __future__ import annotations

from decimal import Decimal

from trainjob.runtime.podsets import format_quantity

# Pod slots are accounted like any other resource: each pod uses one, nodes allocate them.
PODS = "pods"
_ZERO = Decimal(0)

_BYTE_RESOURCES = ("memory", "ephemeral-storage")
_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                 ("Ki", 2**10))
_DECIMAL_UNITS = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
                  ("k", 10**3))


def format_amount(resource: str, amount: Decimal) -> str:
    """``amount`` for people: bytes in the shortest exact unit (64Gi, 500M), the rest as
    a plain decimal number (1000.2 cpu, not 1000200m). Always exact."""
    plain = format_quantity(amount)
    if resource not in _BYTE_RESOURCES and not resource.startswith("hugepages-"):
        return format(amount.normalize(), "f") if amount else "0"
    if amount <= 0 or amount != amount.to_integral_value():
        return plain
    # min keeps the first of equally short spellings: binary units, as memory is written.
    exact = [f"{int(amount) // size}{suffix}" for suffix, size in _BINARY_UNITS + _DECIMAL_UNITS
             if int(amount) % size == 0]
    return min(exact + [plain], key=len)


def fits(free: dict[str, Decimal], wanted: dict[str, Decimal]) -> bool:
    """Whether a Node with ``free`` left has room for a pod asking ``wanted`` (pod slots
    only where the Node counts them)."""
    for resource, amount in wanted.items():
        if amount > 0 and free.get(resource, _ZERO) < amount and (
                resource != PODS or resource in free):
            return False
    return True


def accumulate(total: dict[str, Decimal], amounts: dict[str, Decimal], sign: int = 1) -> None:
    """Add ``amounts`` into ``total`` (``sign`` -1: take them out), resource by resource."""
    for resource, amount in amounts.items():
        total[resource] = total.get(resource, _ZERO) + sign * amount


def shift(room: dict[str, Decimal], amounts: dict[str, Decimal], sign: int = 1) -> None:
    """Add ``amounts`` into a Node's ``room`` (``sign`` -1: a pod takes them), only for the
    resources the Node lists: a Node that does not count pod slots never runs out of them
    (``accumulate`` would write a count of -1 there, and ``fits`` would then read it)."""
    for resource, amount in amounts.items():
        if resource in room:
            room[resource] += sign * amount
