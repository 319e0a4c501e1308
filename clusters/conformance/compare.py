"""Comparing what the two controllers made for one case, field by field, after removing
what identifies an object in its own cluster and the intended differences listed in
``INTENDED``. Pure functions: they see snapshots, never a cluster.

A snapshot of one side is a mapping from an object label ("JobSet", "Secret <job>-mpi-ssh",
"TrainJob status", "admission TrainJob", ...) to the object as read back (None when it does
not exist).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

# Fields that identify an object in its cluster or record when and by whom it was written:
# equal objects differ there by construction.
STATUS = "TrainJob status"
SNAPSHOT_SUFFIX = "-runtime-snapshot"
IDENTITY_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation",
                     "managedFields", "selfLink")


@dataclass(frozen=True)
class Intended:
    """One documented difference between this operator and upstream, removed before
    comparing: ``paths`` of objects whose label starts with ``label``."""

    label: str
    paths: tuple[tuple[str, ...], ...]
    why: str


# docs/conformance.md's table of intended differences says the same; keep the two in step.
INTENDED = (
    Intended("JobSet", (("metadata", "annotations", "trainer.kubeflow.org/total-pods"),
                        ("metadata", "annotations", "trainer.kubeflow.org/total-requests"),
                        ("metadata", "annotations", "trainer.kubeflow.org/jobset-spec-hash"),
                        ("metadata", "labels", "trainer.kubeflow.org/trainjob-name")),
             "the job's totals (the dispatcher's placement reads them from the JobSet), a hash "
             "that lets a resync that changes nothing write nothing, and the TrainJob's name "
             "as a label for selecting a job's JobSet"),
    Intended("TrainJob status", (("conditions", "type=Created"),),
             "the Created condition says whether the JobSet exists, or why not (runtime "
             "missing, build failed); upstream only logs this"),
    Intended("ConfigMap <job>-runtime-snapshot", (("data", "runtime", "spec", "template"),),
             "the runtime's JobSet template as each cluster's CRD stored it: upstream's schema "
             "types it and fills in JobSet's defaults (replicas, groupName, ...), the "
             "project's keeps it as written; both JobSets are compared in full"),
    # No path removed for these two: their data's values are replaced by its sorted keys
    # (``KEYS_ONLY``).
    Intended("Secret", (),
             "SSH key material is random: only the keys of the Secret's data are compared"),
    Intended("ConfigMap <job>-flux-entrypoint", (),
             "the Flux scripts are the project's own text: they run the same Flux commands "
             "and write the same broker configuration, but only the ConfigMap's keys "
             "(init.sh, entrypoint.sh) are compared"),
)
# Objects whose data is compared by its keys alone.
KEYS_ONLY = ("Secret", "ConfigMap <job>-flux-entrypoint")


@dataclass(frozen=True)
class IntendedRefusal:
    """A refusal cause of upstream's that means the same as a different one of the
    operator's: where the operator's answer gives ``operator``, upstream's ``upstream``
    compares as it. Causes are (field path, reason kind), as ``refusal.causes`` reads them."""

    upstream: tuple[str, str]
    operator: tuple[str, str]
    why: str


# Refusals of the same meaning given differently; docs/conformance.md's table says the same.
INTENDED_REFUSALS = (
    IntendedRefusal(("", "Invalid"), ("metadata.name", "Invalid"),
                    "a TrainJob name that is not a DNS-1035 label: upstream's CRD checks it "
                    "with a rule on the whole object (no field), the project's webhook names "
                    "metadata.name"),
    IntendedRefusal(("", "Forbidden"), ("spec.runtimeRef.kind", "NotSupported"),
                    "a runtime kind neither controller runs: the project's CRD lists the "
                    "supported kinds and names the field, upstream's webhook refuses without "
                    "naming one"),
)


def refusal_as_operator_says(upstream: Any, operator: Any) -> Any:
    """Upstream's admission answer with each ``INTENDED_REFUSALS`` cause replaced by the
    operator's where the operator's answer gives it; anything else unchanged."""
    if not isinstance(upstream, dict) or not isinstance(operator, dict):
        return upstream
    given = {tuple(x) for x in operator.get("causes") or []}
    translated = {intended.upstream: intended.operator for intended in INTENDED_REFUSALS
                  if intended.operator in given}
    if not translated:
        return upstream
    causes = [list(translated.get(tuple(x), tuple(x))) for x in upstream.get("causes") or []]
    return {**upstream, "causes": causes}


def normalise(label: str, obj: Any) -> Any:
    """``obj`` without identity fields and intended differences; None stays None."""
    if not isinstance(obj, dict):
        return obj
    obj = copy.deepcopy(obj)
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for key in IDENTITY_METADATA:
            metadata.pop(key, None)
        for ref in metadata.get("ownerReferences") or []:
            ref.pop("uid", None)
    if label == STATUS:
        for condition in obj.get("conditions") or []:
            condition.pop("lastTransitionTime", None)
            condition.pop("observedGeneration", None)
    else:
        obj.pop("status", None)  # a child's status is its own controller's, not compared
    if label.endswith(SNAPSHOT_SUFFIX) and isinstance((obj.get("data") or {}).get("runtime"),
                                                      str):
        # The runtime as each controller read it: compared as an object, without identity.
        runtime = yaml.safe_load(obj["data"]["runtime"])
        obj["data"]["runtime"] = normalise("runtime", runtime)
    for intended in INTENDED:
        if label.startswith(intended.label):
            for path in intended.paths:
                _remove(obj, path)
    if isinstance(metadata, dict):
        for key in ("annotations", "labels"):
            if not metadata.get(key):
                metadata.pop(key, None)
    if label == STATUS and not obj.get("conditions"):
        obj.pop("conditions", None)  # what is left once the intended conditions are gone
    if label.startswith(KEYS_ONLY) and isinstance(obj.get("data"), dict):
        obj["data"] = sorted(obj["data"])
    return obj


def _remove(obj: Any, path: tuple[str, ...]) -> None:
    """Delete ``path`` from ``obj``; a last step ``type=X`` drops the list items whose type
    is X."""
    *parents, last = path
    for step in parents:
        obj = obj.get(step) if isinstance(obj, dict) else None
    if isinstance(obj, list) and last.startswith("type="):
        obj[:] = [x for x in obj if not (isinstance(x, dict) and x.get("type") == last[5:])]
    elif isinstance(obj, dict):
        obj.pop(last, None)


# Lists whose order upstream does not keep: its controller runs its plug-ins in the order of
# a Go map (different at each start), so whose variables come first in a container's env
# (an ML policy's or the TrainJob's) changes from run to run. Compared by name and value.
UNORDERED = (".env",)


def differing_paths(left: Any, right: Any, path: str = "") -> list[str]:
    """Paths where ``left`` and ``right`` differ: lists of objects with names compare by
    name, other lists item by item."""
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(set(left) | set(right), key=str):
            found += differing_paths(left.get(key), right.get(key), f"{path}.{key}")
        return found
    if isinstance(left, list) and isinstance(right, list):
        if _named(left) and _named(right):
            by_name_l = {x.get("name", x.get("type")): x for x in left}
            by_name_r = {x.get("name", x.get("type")): x for x in right}
            found = []
            for name in list(dict.fromkeys([*by_name_l, *by_name_r])):
                found += differing_paths(by_name_l.get(name), by_name_r.get(name),
                                         f"{path}[{name}]")
            if not found and [*by_name_l] != [*by_name_r] and not path.endswith(UNORDERED):
                found.append(f"{path} (order)")
            return found
        if len(left) != len(right):
            return [path or "."]
        found = []
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            found += differing_paths(a, b, f"{path}[{i}]")
        return found
    return [] if left == right else [path or "."]


def _named(items: list) -> bool:
    return bool(items) and all(isinstance(x, dict) and isinstance(x.get("name", x.get("type")),
                                                                  str) for x in items)
