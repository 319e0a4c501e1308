"""The footprint a copy carries: the requests and pod count its job was placed with,
recorded on the copy at creation (an annotation), so that the room it holds is re-made
from the copies after a restart of the dispatcher (``Placer.follow_copy``)."""

from __future__ import annotations

import json
from typing import Any

from trainjob import constants as c


def record(annotations: dict[str, str], requests: dict[str, str], pods: int) -> None:
    """Write the footprint (``requests`` as quantities, ``pods``) into ``annotations``."""
    annotations[c.REQUESTS_ANNOTATION] = json.dumps({"pods": pods, "requests": requests},
                                                    sort_keys=True)


def read(remote: dict[str, Any]) -> tuple[dict[str, str], int] | None:
    """The (requests, pods) recorded on a copy at creation, if any."""
    raw = ((remote.get("metadata") or {}).get("annotations") or {}).get(c.REQUESTS_ANNOTATION)
    try:
        data = json.loads(raw) if raw else None
        return (dict(data["requests"]), int(data["pods"])) if data else None
    except (ValueError, KeyError, TypeError):
        return None
