"""Which runtime a TrainJob's ``spec.runtimeRef`` names, read one way everywhere: the kind
defaults to ClusterTrainingRuntime and the API group to ``trainer.kubeflow.org`` (as the CRD
defaults them), a TrainingRuntime lives in the job's namespace, a ClusterTrainingRuntime in
none. ``find`` looks it up through whatever store the caller has (an informer cache, the API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainjob import constants as c

KINDS = (c.TRAININGRUNTIME_KIND, c.CLUSTERTRAININGRUNTIME_KIND)
# get(kind, namespace, name) -> the runtime as the API returns it, or None.
RuntimeGetter = Callable[[str, str, str], "dict | None"]


@dataclass(frozen=True)
class RuntimeKey:
    kind: str
    namespace: str  # "" for a ClusterTrainingRuntime
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


class UnsupportedRuntimeRef(ValueError):
    """``runtimeRef`` names something that is not a Trainer runtime: (field, reason)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def runtime_key(ref: Any, namespace: str) -> RuntimeKey:
    """The runtime ``ref`` (a ``runtimeRef`` mapping or model) names for a job in ``namespace``;
    raises UnsupportedRuntimeRef for another API group or kind, or a missing name."""
    if not isinstance(ref, dict):
        ref = ref.dump() if hasattr(ref, "dump") else {}
    name, group = ref.get("name"), ref.get("apiGroup", c.TRAINER_GROUP)
    kind = ref.get("kind", c.CLUSTERTRAININGRUNTIME_KIND)
    if not isinstance(name, str) or not name:
        raise UnsupportedRuntimeRef("spec.runtimeRef.name", "must name a runtime")
    if group != c.TRAINER_GROUP:
        raise UnsupportedRuntimeRef("spec.runtimeRef.apiGroup", f"unsupported value "
                                    f"{json.dumps(group)}: must be {c.TRAINER_GROUP}")
    if kind not in KINDS:
        raise UnsupportedRuntimeRef("spec.runtimeRef.kind", f"unsupported value "
                                    f"{json.dumps(kind)}: must be {' or '.join(KINDS)}")
    return RuntimeKey(kind, namespace if kind == c.TRAININGRUNTIME_KIND else "", name)


def key_of_runtime(runtime: dict) -> RuntimeKey:
    """The key a runtime object answers to (its kind from whether it has a namespace)."""
    metadata = runtime.get("metadata") or {}
    namespace = metadata.get("namespace") or ""
    kind = c.TRAININGRUNTIME_KIND if namespace else c.CLUSTERTRAININGRUNTIME_KIND
    return RuntimeKey(kind, namespace, metadata.get("name", ""))


def find(ref: Any, namespace: str, get: RuntimeGetter) -> tuple[RuntimeKey, dict | None]:
    """The key ``ref`` names and the runtime ``get`` finds for it (None when missing)."""
    key = runtime_key(ref, namespace)
    return key, get(key.kind, key.namespace, key.name)
