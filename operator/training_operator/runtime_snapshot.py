"""The runtime a TrainJob was first built from, kept beside it as upstream Trainer v2.3 keeps
it: a ConfigMap ``<trainjob>-runtime-snapshot`` (key ``runtime``, the runtime as YAML),
controlled by the TrainJob. Once it exists the job is rebuilt from it, so editing or deleting
the runtime later changes nothing for jobs that already started.
"""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trainjob.api import TrainJob

SUFFIX = "-runtime-snapshot"
DATA_KEY = "runtime"
# What says when and by whom the runtime was written, not what it is.
_DROPPED_METADATA = ("managedFields", "resourceVersion", "generation")


class SnapshotError(Exception):
    """The snapshot ConfigMap exists but cannot be used (someone else's, or unreadable)."""


def name(job: TrainJob) -> str:
    return f"{job.metadata.name}{SUFFIX}"


def read(core: client.CoreV1Api, job: TrainJob) -> dict[str, Any] | None:
    """The snapshotted runtime of ``job``; None when there is no snapshot yet."""
    try:
        config_map = core.read_namespaced_config_map(name(job), job.metadata.namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    where = f"ConfigMap {job.metadata.namespace}/{name(job)}"
    owners = config_map.metadata.owner_references or []
    if not any(ref.controller and ref.uid == job.metadata.uid for ref in owners):
        raise SnapshotError(f"{where} exists and is not controlled by this TrainJob")
    text = (config_map.data or {}).get(DATA_KEY)
    try:
        runtime = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError as err:
        raise SnapshotError(f"{where}: key {DATA_KEY} is not YAML: {err}") from err
    if not isinstance(runtime, dict):
        raise SnapshotError(f"{where} has no runtime under key {DATA_KEY}")
    return runtime


def body(job: TrainJob, runtime: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The snapshot ConfigMap of ``runtime`` for ``job``, controlled by ``owner``."""
    kept = {**runtime, "metadata": {k: v for k, v in (runtime.get("metadata") or {}).items()
                                    if k not in _DROPPED_METADATA}}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name(job), "namespace": job.metadata.namespace,
                         "ownerReferences": [owner]},
            "data": {DATA_KEY: yaml.safe_dump(kept, sort_keys=True)}}


def create(core: client.CoreV1Api, job: TrainJob, runtime: dict[str, Any],
           owner: dict[str, Any]) -> dict[str, Any]:
    """Create the snapshot; when one appeared meanwhile, return that one's runtime instead
    (the first snapshot wins)."""
    try:
        core.create_namespaced_config_map(job.metadata.namespace, body(job, runtime, owner))
    except ApiException as err:
        if err.status != 409:
            raise
        return read(core, job) or runtime
    return runtime
