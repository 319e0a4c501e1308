"""The options of the ``log`` subresource, as kubectl sends them and a worker's
``pods/log`` takes them (container, follow, tailLines, sinceSeconds, sinceTime, timestamps,
previous, limitBytes): checked here, each refusal naming the option and why. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

BOOLEANS = ("follow", "timestamps", "previous")
COUNTS = ("tailLines", "limitBytes")  # 0 or more (tailLines), 1 or more (limitBytes)
PASSED = ("container", "sinceSeconds", "sinceTime", *BOOLEANS, *COUNTS)
# What the worker's apiserver takes and this API has no use for: never passed on.
IGNORED = ("insecureSkipTLSVerifyBackend", "stream", "pretty")


class BadLogOption(ValueError):
    """An option the worker's pods/log would refuse, or that is not one; the message
    names it and says why."""


def _boolean(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("", "true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise BadLogOption(f"{name}={value!r}: must be true or false")


def _integer(name: str, value: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BadLogOption(f"{name}={value!r}: must be an integer") from None
    if number < least:
        raise BadLogOption(f"{name}={value}: must be {least} or more")
    return number


def log_options(query: Mapping[str, list[str]]) -> dict[str, object]:
    """The worker's pods/log parameters (as the kubernetes client names them) for a
    request's query, or BadLogOption."""
    options: dict[str, object] = {}
    for name, values in query.items():
        value = values[-1] if values else ""
        if name in IGNORED:
            continue
        if name not in PASSED:
            raise BadLogOption(f"{name}: not an option of the log subresource (options: "
                               f"{', '.join(PASSED)})")
        if name in BOOLEANS:
            options[name] = _boolean(name, value)
        elif name == "tailLines":
            options[name] = _integer(name, value, 0)
        elif name == "limitBytes":
            options[name] = _integer(name, value, 1)
        elif name == "sinceSeconds":
            options[name] = _integer(name, value, 1)
        elif name == "sinceTime":
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise BadLogOption(f"sinceTime={value!r}: must be an RFC 3339 time") from None
            options[name] = value
        elif name == "container":
            if not value:
                raise BadLogOption("container: must name a container of the Pod")
            options[name] = value
    if "sinceSeconds" in options and "sinceTime" in options:
        raise BadLogOption("sinceSeconds and sinceTime: at most one of them may be given")
    return options


def as_query(options: Mapping[str, object]) -> list[tuple[str, str]]:
    """``options`` as the worker's pods/log query parameters."""
    return [(name, str(value).lower() if isinstance(value, bool) else str(value))
            for name, value in options.items()]
