"""Test helpers that go with the harness: waiting on a condition, with a useful failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ConditionTimeout(AssertionError):
    """Raised by ``eventually``; its message says what was expected and what was last seen."""


def eventually(
    observe: Callable[[], T],
    check: Callable[[T], bool],
    *,
    expected: str,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> T:
    """Call ``observe()`` until ``check`` accepts its result; return that result.

    On timeout, fail with ``expected`` and the last observation (or the last exception
    ``observe`` raised), so a red test explains itself.
    """
    deadline = time.monotonic() + timeout
    last: object = "nothing observed"
    while True:
        try:
            value = observe()
            if check(value):
                return value
            last = value
        except Exception as err:  # noqa: BLE001 - the last error is part of the report
            last = f"{type(err).__name__}: {err}"
        if time.monotonic() >= deadline:
            raise ConditionTimeout(
                f"expected {expected} within {timeout:.1f}s; last seen: {last!r}"
            )
        time.sleep(interval)
