"""``spec.runtimePatches``: each manager's patch of the runtime template, laid over it in
list order before anything else resolves the runtime (as upstream Trainer v2.3 does).

A patch's ``trainingRuntimeSpec.template.spec`` is merged into the JobSet template spec the
way a Kubernetes strategic merge patch merges a JobSet spec: objects key by key; lists of
replicated jobs, containers, init containers, env, image pull secrets and scheduling gates
by ``name``; volume mounts by ``mountPath``; a volume of the same name is replaced (its
source is one of many kinds); every other list (tolerations, args) is replaced whole; a
null removes the key. The replicated jobs keep the runtime's order. The template metadata's
labels and annotations go to the JobSet, over the runtime's.
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob.api import TrainJob

# List fields merged item by item, and the key that matches items.
_MERGE_KEYS = {
    "replicatedJobs": "name",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "volumeMounts": "mountPath",
    "volumes": "name",
}
# Items replaced whole when the key matches (strategic merge's retainKeys).
_REPLACED_ITEMS = {"volumes"}


def patched_template_spec(template_spec: dict[str, Any], job: TrainJob) -> dict[str, Any]:
    """The runtime's JobSet template spec with every runtime patch of ``job`` merged in."""
    merged = copy.deepcopy(template_spec)
    order = [j.get("name") for j in merged.get("replicatedJobs") or [] if isinstance(j, dict)]
    for patch in job.spec.runtime_patches:
        spec = _template(patch).get("spec")
        if isinstance(spec, dict):
            merged = _merge_object(merged, spec)
    jobs = merged.get("replicatedJobs")
    if isinstance(jobs, list):
        position = {name: i for i, name in enumerate(order)}
        jobs.sort(key=lambda j: position.get(j.get("name"), len(position)))
    return merged


def patched_metadata(kind: str, runtime_values: dict[str, str], job: TrainJob) -> dict[str, str]:
    """``kind`` ("labels" or "annotations") of the runtime template, with each patch's
    template metadata laid over it in order."""
    merged = dict(runtime_values)
    for patch in job.spec.runtime_patches:
        metadata = _template(patch).get("metadata")
        values = metadata.get(kind) if isinstance(metadata, dict) else None
        if isinstance(values, dict):
            merged.update(values)
    return merged


def _template(patch: Any) -> dict[str, Any]:
    spec = getattr(patch, "training_runtime_spec", None) or {}
    template = spec.get("template") if isinstance(spec, dict) else None
    return template if isinstance(template, dict) else {}


def _merge_object(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in _MERGE_KEYS and isinstance(value, list) and isinstance(base.get(key), list):
            merged[key] = _merge_list(base[key], value, _MERGE_KEYS[key],
                                      replace=key in _REPLACED_ITEMS)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge_object(base[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(base: list[Any], patch: list[Any], key: str, replace: bool) -> list[Any]:
    merged = list(base)
    for item in patch:
        if not isinstance(item, dict):
            continue
        index = next((i for i, old in enumerate(merged)
                      if isinstance(old, dict) and old.get(key) == item.get(key)), None)
        if index is None:
            merged.append(copy.deepcopy(item))
        elif replace:
            merged[index] = copy.deepcopy(item)
        else:
            merged[index] = _merge_object(merged[index], item)
    return merged
