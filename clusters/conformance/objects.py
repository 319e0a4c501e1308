"""A conformance case and the small builders its objects are written with."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainjob import constants as c

# When a case's update is sent: at once after the create; once the controller has built the
# suspended job (its JobSet exists, its Suspended condition is True), so the update meets
# the same state on both sides; or once the JobSet reports a replicated job with active
# pods (upstream's runtime-patch rule looks at that).
UPDATE_AT_ONCE = ""
UPDATE_WHEN_SUSPENDED = "suspended"
UPDATE_WHEN_ACTIVE = "active"


@dataclass
class Case:
    """One TrainJob (``job`` None for a runtime-only case) and the runtimes it needs;
    ``update``, a JSON merge patch sent after creation (its answer is compared like the
    create's) to the TrainJob, or, in a runtime-only case, to its first runtime;
    ``update_when`` says when."""

    name: str
    source: str
    job: dict | None = None
    runtimes: list[dict] = field(default_factory=list)
    update: dict | None = None
    update_when: str = UPDATE_AT_ONCE
    # PriorityClasses the case needs on both clusters (created before any case's objects).
    priority_classes: tuple[str, ...] = ()
    # Where this case differs on purpose, and why: the objects (labels, as the table names
    # them; all of the case's when empty) whose differences the reason explains.
    intended: str = ""
    intended_objects: tuple[str, ...] = ()


def trainjob(name: str, runtime: str, trainer: dict | None = None,
             kind: str = c.CLUSTERTRAININGRUNTIME_KIND, **spec) -> dict:
    body = {"runtimeRef": {"name": runtime, "kind": kind, "apiGroup": c.TRAINER_GROUP}, **spec}
    if trainer is not None:
        body["trainer"] = trainer
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name}, "spec": body}


def runtime(name: str, ml_policy: dict, jobs: list[dict],
            kind: str = c.CLUSTERTRAININGRUNTIME_KIND, **spec) -> dict:
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": kind,
            "metadata": {"name": name},
            "spec": {"mlPolicy": ml_policy, **spec,
                     "template": {"spec": {"replicatedJobs": jobs}}}}


def job(name: str, role: str | None = None, container: str | None = None,
        **container_fields) -> dict:
    """A replicated job of one container (named ``container``, else after the job),
    labelled as the TrainJob's ``role`` step when given."""
    template: dict = {"spec": {"template": {"spec": {"containers": [
        {"name": container or name, "image": f"{name}:v1", **container_fields}]}}}}
    if role:
        template["metadata"] = {"labels": {c.ANCESTOR_LABEL: role}}
    return {"name": name, "template": template}


def torch_runtime() -> dict:
    """``cf-torch``: one trainer job of one ``node`` container, the torch policy; shared by
    the cases that need a plain runtime (a runtime is applied once, by kind and name)."""
    return runtime("cf-torch", {"numNodes": 1, "torch": {}},
                   [job("node", c.ROLE_TRAINER, resources={"requests": {"cpu": "3"}})])
