"""Waiting for a runnable's death under a ``controller_kit.manager.Manager``."""

from __future__ import annotations

from clusters.testing import eventually


def dead(manager, expected: str) -> str:
    """Wait for a death's two marks: readiness names it first, and the stop is asked for
    once the death is logged (which a loaded machine may take a while to do). What
    readiness says then."""
    seen = eventually(lambda: (manager.stop_requested.is_set(), manager.ready()),
                      lambda seen: seen[0] and not seen[1][0], timeout=10,
                      expected=f"{expected}, and the stop asked for")
    assert manager.failed()
    return seen[1][1]
