"""Admission's one Volcano rule that needs the cluster: a runtime that gangs its pods with
Volcano and names a priorityClassName in a pod template must name a PriorityClass that
exists, or Volcano's PodGroup (which carries that name) never schedules.

The rule as upstream's Volcano plug-in has it: the runtime's replicated jobs in order; the
two built-in names (``system-cluster-critical``, ``system-node-critical``) exist on every
cluster and end the check; any other name must resolve. Upstream names the field
``spec.templateSpec.priorityClassName`` (Invalid), whichever job named it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FIELD = "spec.templateSpec.priorityClassName"
BUILT_IN = ("system-cluster-critical", "system-node-critical")


def names(runtime: Any) -> list[str]:
    """The priorityClassNames to look up for ``runtime`` (none unless it uses Volcano), in
    job order, stopping at a built-in one as upstream does."""
    spec = runtime.get("spec") if isinstance(runtime, dict) else None
    policy = spec.get("podGroupPolicy") if isinstance(spec, dict) else None
    if not isinstance(policy, dict) or policy.get("volcano") is None:
        return []
    template = spec.get("template")
    jobs = _get(_get(template, "spec"), "replicatedJobs")
    found = []
    for job in jobs if isinstance(jobs, list) else []:
        name = _get(_get(_get(_get(_get(job, "template"), "spec"), "template"), "spec"),
                    "priorityClassName")
        if not isinstance(name, str):
            continue
        if name in BUILT_IN:
            break
        found.append(name)
    return found


def problems(runtime: Any, exists: Callable[[str], bool]) -> list[tuple[str, str]]:
    """(field, reason) for each name of ``names(runtime)`` that ``exists`` does not find.
    ``exists`` may raise: upstream refuses a name it could not read too (fail closed)."""
    found = []
    for name in names(runtime):
        try:
            if exists(name):
                continue
            why = "not found"
        except Exception as err:  # noqa: BLE001 - a lookup that failed is a refusal
            why = f"cannot be read ({type(err).__name__})"
        found.append((FIELD, f"PriorityClass {name!r} named by the runtime's pod template "
                             f"{why}: Volcano's PodGroup would carry a priority that does "
                             f"not exist; create the PriorityClass first"))
    return found


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None
