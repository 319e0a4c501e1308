"""What a refusal means, read from the API Status an apiserver answered with, so two refusals
worded differently compare equal when they name the same fields for the same reasons.

A refusal's meaning is its set of causes, each (field path, reason kind). The causes come
from the Status's ``details.causes`` when there are any (the apiserver's schema and CEL
validation, and webhooks that give them); otherwise they are parsed from the message, which
Kubernetes writes in ``field.ErrorList`` form (``spec.x: Invalid value: 3: must be ...``,
several in brackets separated by commas). A refusal that names no field (``unsupported
runtime``) has one cause with the empty field and the Status's own reason.

Wording, HTTP code and Status reason are not part of the meaning: a webhook built on
controller-runtime answers every refusal with 403 Forbidden, the apiserver's schema
validation with 422 Invalid, for the same field errors.

Pure functions: they see a Status, never a cluster.
"""

from __future__ import annotations

import re
from typing import Any

# metav1.StatusCause reasons, and the words field.ErrorType prints in a message, as one kind.
CAUSE_KINDS = {
    "FieldValueInvalid": "Invalid",
    "FieldValueTypeInvalid": "Invalid",  # printed as "Invalid value" too
    "FieldValueRequired": "Required",
    "FieldValueNotSupported": "NotSupported",
    "FieldValueForbidden": "Forbidden",
    "FieldValueDuplicate": "Duplicate",
    "FieldValueNotFound": "NotFound",
    "FieldValueTooLong": "TooLong",
    "FieldValueTooMany": "TooMany",
    "FieldValueTooShort": "TooShort",
    "FieldValueTooFew": "TooFew",
    "InternalError": "Internal",
}
MESSAGE_KINDS = {
    "Invalid value": "Invalid",
    "Required value": "Required",
    "Unsupported value": "NotSupported",
    "Forbidden": "Forbidden",
    "Duplicate value": "Duplicate",
    "Not found": "NotFound",
    "Too long": "TooLong",
    "Too many": "TooMany",
    "Too short": "TooShort",
    "Too few": "TooFew",
    "Internal error": "Internal",
}
# A field path as field.Path prints it: dotted names, [index] or [key] steps; "<nil>" is
# the root (a rule on the whole object).
_PATH = r"<nil>|[A-Za-z_$][\w$-]*(?:\.[A-Za-z_$][\w$-]*|\[[^\]\[]*\])*"
# Where a field error can start in a message: at its start, after the apiserver's prefix
# ("... is invalid: ", "... denied the request: "), or after an aggregate's "[" or ", ".
_ERROR = re.compile(r"(?:^|: |\[|, )(" + _PATH + r"): ("
                    + "|".join(re.escape(k) for k in MESSAGE_KINDS) + r")(?=$|[:,\]])")

UNCHECKED_RULES = "validation rules were not checked"

Cause = tuple[str, str]


def causes(status: Any) -> list[Cause]:
    """The (field, kind) causes of a refusal's Status, sorted and without repeats."""
    if not isinstance(status, dict):
        return [("", "Unknown")]
    details = status.get("details") if isinstance(status.get("details"), dict) else {}
    found = [(_field(cause.get("field")), CAUSE_KINDS.get(cause.get("reason"),
                                                         str(cause.get("reason") or "")))
             for cause in details.get("causes") or []
             if isinstance(cause, dict) and not _note(cause)]
    if not found:
        found = parse_message(str(status.get("message") or ""))
    if not found:
        found = [("", str(status.get("reason") or "Unknown"))]
    return sorted(set(found))


def _note(cause: dict) -> bool:
    """The apiserver's note that it skipped CEL rules because of earlier schema errors: a
    cause of the whole object that says nothing about the object."""
    return UNCHECKED_RULES in str(cause.get("message") or "")


def parse_message(message: str) -> list[Cause]:
    """The (field, kind) pairs of a message in ``field.ErrorList`` form, in order."""
    return [(_field(m.group(1)), MESSAGE_KINDS[m.group(2)]) for m in _ERROR.finditer(message)]


def _field(path: Any) -> str:
    """A field path in one spelling: the root as "", each name's first letter lower case
    (a Go field name, ``spec.RuntimeRef``, is the JSON field ``spec.runtimeRef``)."""
    if not isinstance(path, str) or path in ("", "<nil>"):
        return ""
    return re.sub(r"(^|\.)([A-Z])", lambda m: m.group(1) + m.group(2).lower(), path)


def answer(status: Any, code: int | None = None) -> dict[str, Any]:
    """A refused admission as the conformance snapshot records it: the meaning (``causes``,
    compared) beside the code and message (shown, not compared)."""
    message = status.get("message", "") if isinstance(status, dict) else str(status or "")
    return {"allowed": False, "causes": [list(c) for c in causes(status)], "code": code,
            "message": message}


def differences(left: Any, right: Any) -> list[str]:
    """Where two admission answers differ in meaning: ``allowed``, or ``causes <field>`` for
    each field the two refusals name for different reasons (``causes (object)`` for a
    refusal that names no field)."""
    left, right = left or {}, right or {}
    if bool(left.get("allowed")) != bool(right.get("allowed")):
        return ["allowed"]
    if left.get("allowed"):
        return []
    by_field: dict[str, list[set[str]]] = {}
    for side, given in enumerate((left.get("causes") or [], right.get("causes") or [])):
        for field, kind in given:
            by_field.setdefault(field, [set(), set()])[side].add(kind)
    return [f"causes {field or '(object)'}" for field, (a, b) in sorted(by_field.items())
            if a != b]
