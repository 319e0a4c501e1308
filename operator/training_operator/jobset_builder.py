"""The JobSet a TrainJob runs as, built from its RuntimeInfo (a pure function).

The JobSet carries the job's totals as annotations (``TOTAL_PODS_ANNOTATION``,
``TOTAL_REQUESTS_ANNOTATION``), computed by the shared ``trainjob.runtime.totals`` that the
dispatcher's placement uses too, and a hash of everything the operator sets
(``SPEC_HASH_ANNOTATION``) so a resync that would change nothing writes nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime import RuntimeInfo

TOTAL_PODS_ANNOTATION = "trainer.kubeflow.org/total-pods"
TOTAL_REQUESTS_ANNOTATION = "trainer.kubeflow.org/total-requests"
SPEC_HASH_ANNOTATION = "trainer.kubeflow.org/jobset-spec-hash"
TRAINJOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"


def owner_reference(job: TrainJob) -> dict[str, Any]:
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": c.TRAINJOB_KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def spec_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def build_jobset(job: TrainJob, info: RuntimeInfo) -> dict[str, Any]:
    """The JobSet apply configuration for ``job``: same name and namespace, controlled by
    the TrainJob, ``spec.suspend`` following it."""
    labels = {**info.labels, TRAINJOB_NAME_LABEL: job.metadata.name}
    replicated_jobs = []
    for pod_set in info.pod_sets:
        replicated = copy.deepcopy(pod_set.job)
        if pod_set.role:
            # A role read from the job's name (seed runtimes) is written down as upstream's
            # label, so every reader of the JobSet finds it where upstream puts it.
            metadata = replicated.setdefault("template", {}).setdefault("metadata", {})
            metadata["labels"] = {**(metadata.get("labels") or {}), c.ANCESTOR_LABEL: pod_set.role}
        replicated_jobs.append(replicated)
    spec = {**copy.deepcopy(info.jobset_spec), "replicatedJobs": replicated_jobs}
    totals = info.totals
    annotations = {
        **info.annotations,
        TOTAL_PODS_ANNOTATION: str(totals.pods),
        TOTAL_REQUESTS_ANNOTATION: json.dumps(totals.as_strings(), sort_keys=True),
    }
    # The hash covers what the operator decides apart from the suspend flag, which is
    # applied on its own while the job runs.
    annotations[SPEC_HASH_ANNOTATION] = spec_hash(
        {"spec": spec, "labels": labels, "annotations": annotations,
         "objects": [o.body for o in info.objects]}
    )
    spec["suspend"] = job.spec.suspend
    return {
        "apiVersion": c.JOBSET_API_VERSION,
        "kind": c.JOBSET_KIND,
        "metadata": {
            "name": job.metadata.name,
            "namespace": job.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
