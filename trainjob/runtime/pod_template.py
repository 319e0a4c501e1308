"""Editing a replicated job's pod template the way upstream Trainer merges into it: lists of
named things by name, env by name, resources per resource name. Shared by the framework core
and the plug-ins (neither imports the other for these).
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.podsets import PodSet


def merge_by_name(target: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    """Add ``items`` to ``target``, replacing entries of the same ``name``."""
    for item in items:
        for i, old in enumerate(target):
            if old.get("name") == item.get("name"):
                target[i] = copy.deepcopy(item)
                break
        else:
            target.append(copy.deepcopy(item))


def merge_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Set each variable in ``env`` on ``container``, replacing one of the same name (no
    empty ``env`` list is added: a container without variables has none)."""
    if env:
        merge_by_name(container.setdefault("env", []), env)


def apply_node_settings(pod_set: PodSet, job: TrainJob) -> None:
    """``trainer.env`` and ``trainer.resourcesPerNode`` on ``pod_set``'s ``node`` container:
    the trainer step's, and any other job a policy runs training processes in (MPI's node
    job when the launcher runs as a node)."""
    trainer = job.spec.trainer
    container = pod_set.container(c.NODE)
    if trainer is None or container is None:
        return
    merge_env(container, trainer.env)
    if trainer.resources_per_node is not None:
        container["resources"] = merge_resources(container.get("resources") or {},
                                                 trainer.resources_per_node.dump())


def merge_resources(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base`` as upstream merges resourcesPerNode onto the runtime's
    resources: limits and requests per resource name, claims by name."""
    merged = copy.deepcopy(base)
    for key in ("limits", "requests"):
        if override.get(key):
            merged[key] = {**(merged.get(key) or {}), **override[key]}
    if override.get("claims"):
        merge_by_name(merged.setdefault("claims", []), override["claims"])
    return merged
