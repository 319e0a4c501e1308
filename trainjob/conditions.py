"""Conditions on API objects as plain dicts: find, upsert, when one last changed
and whether a TrainJob is finished. One module, so both sides write them alike."""

from __future__ import annotations

from typing import Any

from controller_kit.api_time import parse_time
from trainjob import constants as c

Obj = dict[str, Any]


def conditions(obj: Obj | None) -> list[dict]:
    return ((obj or {}).get("status") or {}).get("conditions") or []


def find(obj: Obj | None, type_: str) -> dict | None:
    return next((x for x in conditions(obj) if x.get("type") == type_), None)


def is_true(obj: Obj | None, type_: str) -> bool:
    return (find(obj, type_) or {}).get("status") == "True"


def upsert(existing: list[dict], condition: dict) -> list[dict]:
    """``existing`` with ``condition`` in place of the one of its type, at its position
    (appended when new). The transition time is kept when the status did not change, as
    the API's own conventions ask."""
    current = next((x for x in existing if x.get("type") == condition["type"]), None)
    if current is None:
        return [*existing, condition]
    if current.get("status") == condition.get("status") and current.get("lastTransitionTime"):
        condition = {**condition, "lastTransitionTime": current["lastTransitionTime"]}
    return [condition if x is current else x for x in existing]


def finished(obj: Obj | None) -> bool:
    """A TrainJob (or its copy) that is Complete or Failed."""
    return any(is_true(obj, type_) for type_ in c.FINISHED_CONDITIONS)


def finished_time(obj: Obj | None) -> float | None:
    """When it finished (the transition time of its Complete or Failed condition)."""
    for condition in conditions(obj):
        if condition.get("type") in c.FINISHED_CONDITIONS and \
                condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None
