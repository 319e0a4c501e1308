"""Times as the Kubernetes API writes them (metav1.Time in JSON): formatted and read back."""

from __future__ import annotations

import calendar
import functools
import time

# metav1.Time in JSON: RFC 3339 in UTC, whole seconds.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(seconds: float | None = None) -> str:
    """``seconds`` since the epoch (default: now) as the API writes times."""
    return time.strftime(TIME_FORMAT, time.gmtime(seconds))


# Controllers read the same stamps again on every reconcile of an object; strptime is slow.
@functools.lru_cache(maxsize=8192)
def parse_time(stamp: str | None) -> float | None:
    """An API time as seconds since the epoch; None when absent or not in that form."""
    try:
        return calendar.timegm(time.strptime(stamp, TIME_FORMAT)) if stamp else None
    except ValueError:
        return None
