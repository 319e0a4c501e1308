"""The conformance table: one line per object of each case, equal or different, and the
differing paths; a summary line last."""

from __future__ import annotations

import json
from typing import Any

from clusters.conformance import updates
from clusters.conformance.run import Row

MAX_PATHS = 6


def table(rows: list[Row], verbose: bool = False) -> str:
    lines = [("CASE", "OBJECT", "RESULT", "DIFFERING PATHS")]
    for row in rows:
        shown = row.paths[:MAX_PATHS] + ([f"... {len(row.paths) - MAX_PATHS} more"]
                                         if len(row.paths) > MAX_PATHS else [])
        result = "equal" if row.equal else "intended" if row.intended else "different"
        lines.append((row.case, row.label, result, ", ".join(shown)))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    out = ["  ".join([*(cell.ljust(w) for cell, w in zip(line[:3], widths, strict=True)),
                      line[3]]).rstrip()
           for line in lines]
    if verbose:
        for row in rows:
            if not row.equal:
                out += [f"--- {row.case} {row.label}",
                        f"    upstream: {_short(row.upstream)}",
                        f"    operator: {_short(row.operator)}"]
    out.append(summary(rows))
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    different = [r for r in rows if r.unexplained]
    intended = [r for r in rows if r.intended]
    cases = {r.case for r in rows}
    failing = {r.case for r in different}
    return (f"{len(rows)} objects in {len(cases)} cases: "
            f"{len(rows) - len(different) - len(intended)} equal, {len(intended)} intended "
            f"differences, {len(different)} different (in {len(failing)} cases); "
            + refusal_summary(rows))


def refused(row: Row) -> bool:
    """An admission row (a create's or an update's) where at least one side refused."""
    return updates.is_answer(row.label) and any(
        isinstance(side, dict) and side.get("allowed") is False
        for side in (row.upstream, row.operator))


def refusal_summary(rows: list[Row]) -> str:
    """How the refusals compare: same meaning (fields and reasons), intended, different."""
    refusals = [r for r in rows if refused(r)]
    same = sum(1 for r in refusals if r.equal)
    intended = sum(1 for r in refusals if r.intended)
    return (f"{len(refusals)} refusals: {same} of the same meaning, {intended} intended, "
            f"{len(refusals) - same - intended} different")


def as_json(rows: list[Row]) -> str:
    return json.dumps([{"case": r.case, "object": r.label, "equal": r.equal, "paths": r.paths,
                        "intended": r.intended} for r in rows], indent=2)


def _short(value: Any, limit: int = 2000) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."
