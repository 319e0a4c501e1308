"""Validating admission for TrainJobs (managedBy, names, trainer settings, overrides and
runtime patches against their runtime, what the plug-ins refuse) and, through
``runtime_webhook``, for runtimes: the rules, with no HTTP in sight.

``review`` takes an ``admission.k8s.io/v1`` AdmissionReview as a dict and returns the
response AdmissionReview. It never raises: whatever arrives (the apiserver's request, or
garbage) gets a well-formed answer, because an exception here would reach the apiserver as
a failed webhook call and hide the reason from the user.

What needs state the webhook cannot see in the object itself (the runtime, the JobSet, a
PriorityClass) comes through ``Lookups``; the operator passes a cache-backed implementation,
so a review costs no network round trip except on a cache miss (and the PriorityClass GET a
Volcano runtime naming one asks for).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.utils.quantity import parse_quantity

from training_operator import priority_classes, runtime_webhook
from trainjob import constants as c
from trainjob import runtime_ref
from trainjob.managed_by import ALLOWED_VALUES, allowed, managed_by, operator_manages

ADMISSION_API_VERSION = "admission.k8s.io/v1"
ADMISSION_KIND = "AdmissionReview"

# A TrainJob's name becomes the JobSet's name, its headless Service and the pods' subdomain:
# a Service name must be a DNS-1035 label.
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1035_MAX_LENGTH = 63
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DOMAIN_PATH_REST = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")
POSITIVE_INTEGER = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also accepts "²"
PROC_WORDS = ("auto", "cpu", "gpu")

# Causes as metav1.StatusCause reasons, so kubectl prints them like the apiserver's own.
INVALID = "FieldValueInvalid"
NOT_FOUND = "FieldValueNotFound"
DUPLICATE = "FieldValueDuplicate"
NOT_SUPPORTED = "FieldValueNotSupported"
FORBIDDEN = "FieldValueForbidden"
# A plug-in's kind of refusal (``field.ErrorType``, as upstream's plug-ins give it) as a cause.
CAUSES = {"Invalid": INVALID, "Forbidden": FORBIDDEN, "NotSupported": NOT_SUPPORTED,
          "Duplicate": DUPLICATE, "NotFound": NOT_FOUND}


class Lookups(Protocol):
    """Reads the objects a review depends on; None when the object does not exist."""

    def runtime(self, namespace: str, kind: str, name: str) -> dict | None:
        """A TrainingRuntime in ``namespace``, or a (cluster-scoped) ClusterTrainingRuntime."""

    def jobset(self, namespace: str, name: str) -> dict | None:
        """The JobSet ``namespace/name``."""

    def priority_class(self, name: str) -> dict | None:
        """The (cluster-scoped) PriorityClass ``name``."""


class ApiLookups:
    """``Lookups`` by direct GETs against the API server (no cache)."""

    def __init__(self, api_client: Any, request_timeout: float = 3.0):
        from kubernetes import client

        self._custom = client.CustomObjectsApi(api_client)
        # Well inside the webhook's 5 s timeout, so a slow read becomes our own error.
        self._timeout = request_timeout

    def _get(self, read, *args) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return read(*args, _request_timeout=self._timeout)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def runtime(self, namespace: str, kind: str, name: str) -> dict | None:
        if kind == c.TRAININGRUNTIME_KIND:
            return self._get(self._custom.get_namespaced_custom_object, c.TRAINER_GROUP,
                             c.TRAINER_VERSION, namespace, c.TRAININGRUNTIMES, name)
        return self._get(self._custom.get_cluster_custom_object, c.TRAINER_GROUP,
                         c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, name)

    def jobset(self, namespace: str, name: str) -> dict | None:
        return self._get(self._custom.get_namespaced_custom_object, c.JOBSET_GROUP,
                         c.JOBSET_VERSION, namespace, c.JOBSETS, name)

    def priority_class(self, name: str) -> dict | None:
        from kubernetes import client

        scheduling = client.SchedulingV1Api(self._custom.api_client)
        found = self._get(scheduling.read_priority_class, name)
        return None if found is None else self._custom.api_client.sanitize_for_serialization(
            found)


class CacheLookups:
    """``Lookups`` from the operator's informer caches (no API call per review); for a
    namespace outside the operator's ``--namespace`` (not cached) it asks the API server."""

    def __init__(self, api_client: Any, namespace: str | None, jobsets: Any, runtimes: Any):
        self._api_client = api_client
        self._namespace = namespace
        self._jobsets = jobsets
        self._runtimes = runtimes  # anything with runtime(kind, namespace, name)
        self._api: ApiLookups | None = None

    def _direct(self) -> ApiLookups:
        if self._api is None:
            self._api = ApiLookups(self._api_client)
        return self._api

    def _cached(self, namespace: str) -> bool:
        return self._namespace in (None, namespace)

    def runtime(self, namespace: str, kind: str, name: str) -> dict | None:
        if kind == c.CLUSTERTRAININGRUNTIME_KIND or self._cached(namespace):
            return self._runtimes.runtime(kind, namespace, name)
        return self._direct().runtime(namespace, kind, name)

    def jobset(self, namespace: str, name: str) -> dict | None:
        if self._cached(namespace):
            return self._jobsets.get(namespace, name)
        return self._direct().jobset(namespace, name)

    def priority_class(self, name: str) -> dict | None:
        # A GET at admission: only a Volcano runtime that names a priority class asks.
        return self._direct().priority_class(name)


@dataclass(frozen=True)
class Problem:
    """One refusal reason: the field path, why, and the StatusCause reason."""

    field: str
    reason: str
    cause: str = INVALID

    @property
    def forbidden(self) -> bool:
        return self.cause == FORBIDDEN


class _Malformed(Exception):
    """The AdmissionReview itself is unusable (400)."""


class _LookupFailed(Exception):
    """Reading a runtime or JobSet failed; refuse rather than guess (500)."""


# --- the AdmissionReview envelope ------------------------------------------------------------


def review(admission_review: Any, lookups: Lookups) -> dict:
    """The AdmissionReview response for ``admission_review``; never raises."""
    uid = ""
    try:
        if isinstance(admission_review, dict):
            request = admission_review.get("request")
            if isinstance(request, dict) and isinstance(request.get("uid"), str):
                uid = request["uid"]
        return _review(admission_review, lookups, uid)
    except _Malformed as err:
        return response(uid, allowed=False, code=400, reason="BadRequest",
                        message=f"malformed AdmissionReview: {err}")
    except _LookupFailed as err:
        return response(uid, allowed=False, code=500, reason="InternalError", message=str(err))
    except Exception as err:  # noqa: BLE001 - never let a request crash the webhook
        return response(uid, allowed=False, code=500, reason="InternalError",
                        message=f"TrainJob webhook internal error: {type(err).__name__}: "
                                f"{_short(err)}")


def review_json(body: bytes | str, lookups: Lookups) -> dict:
    """``review`` of a raw request body; malformed JSON gets a 400 refusal."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as err:
        return response("", allowed=False, code=400, reason="BadRequest",
                        message=f"malformed AdmissionReview: body is not JSON: {_short(err)}")
    return review(parsed, lookups)


def response(uid: str, *, allowed: bool, code: int = 200, reason: str = "",
             message: str = "", causes: list[dict] | None = None,
             details: dict | None = None) -> dict:
    """An ``admission.k8s.io/v1`` AdmissionReview carrying one response."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        status: dict[str, Any] = {"status": "Failure", "code": code, "reason": reason,
                                  "message": message}
        if causes:
            status["details"] = {**(details or {}), "causes": causes}
        answer["status"] = status
    return {"apiVersion": ADMISSION_API_VERSION, "kind": ADMISSION_KIND, "response": answer}


def _review(admission_review: Any, lookups: Lookups, uid: str) -> dict:
    if not isinstance(admission_review, dict):
        raise _Malformed(f"expected an object, got {_type(admission_review)}")
    request = admission_review.get("request")
    if not isinstance(request, dict):
        raise _Malformed("request is missing or not an object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise _Malformed("request.uid is missing")
    operation = request.get("operation")
    if operation in ("DELETE", "CONNECT"):
        return response(uid, allowed=True)  # nothing of ours to check
    if operation not in ("CREATE", "UPDATE"):
        raise _Malformed(f"request.operation {_show(operation)} is not CREATE or UPDATE")
    new = _object(request, "object")
    old = _object(request, "oldObject") if operation == "UPDATE" else None

    metadata = new["metadata"]
    namespace = _str(metadata.get("namespace")) or _str(request.get("namespace"))
    name = _str(metadata.get("name")) or _str(request.get("name"))
    kind = _str((request.get("kind") or {}).get("kind")) if isinstance(
        request.get("kind"), dict) else ""
    kind = kind or _str(new.get("kind")) or c.TRAINJOB_KIND

    if kind in runtime_webhook.KINDS:
        scoped = namespace and kind == c.TRAININGRUNTIME_KIND  # the other is cluster-scoped
        subject = f"{kind} {namespace + '/' if scoped else ''}{name or '<unnamed>'}"
        problems = [Problem(field, reason) for field, reason in runtime_webhook.problems(new)] \
            if runtime_webhook.checked(kind, operation) else []
    else:
        kind = c.TRAINJOB_KIND
        subject = f"TrainJob {namespace}/{name or '<unnamed>'}"
        if operation == "CREATE":
            problems = validate_create(new, namespace, lookups)
        else:
            problems = validate_update(old, new, namespace, name, lookups)
    if not problems:
        return response(uid, allowed=True)
    forbidden = all(p.forbidden for p in problems)
    return response(
        uid, allowed=False,
        code=403 if forbidden else 422,
        reason="Forbidden" if forbidden else "Invalid",
        message=f"{subject}: " + "; ".join(f"{p.field}: {p.reason}" for p in problems),
        causes=[{"reason": p.cause, "field": p.field, "message": p.reason} for p in problems],
        details={"name": name, "group": c.TRAINER_GROUP, "kind": kind},
    )


def _object(request: dict, key: str) -> dict:
    obj = request.get(key)
    if not isinstance(obj, dict):
        raise _Malformed(f"request.{key} is missing or not an object")
    if not isinstance(obj.get("metadata"), dict):
        raise _Malformed(f"request.{key}.metadata is missing or not an object")
    if not isinstance(obj.get("spec"), dict):
        raise _Malformed(f"request.{key}.spec is missing or not an object")
    return obj


# --- the rules -------------------------------------------------------------------------------


def validate_create(job: dict, namespace: str, lookups: Lookups) -> list[Problem]:
    """Problems with a new TrainJob; the runtime-dependent ones only for operator-owned jobs
    (a MultiKueue job's runtime lives on a worker, not here)."""
    spec = job["spec"]
    problems = check_managed_by(spec)
    problems += check_name(job)
    problems += check_trainer(spec)
    problems += check_patch_managers(spec)
    if operator_manages(managed_by(spec)):
        problems += check_against_runtime(job, namespace, lookups, problems)
    return _unique(problems)


def validate_update(old: dict, new: dict, namespace: str, name: str,
                    lookups: Lookups) -> list[Problem]:
    """Problems with changing ``old`` into ``new``: managedBy, when podSpecOverrides and
    runtimePatches may change, and a changed spec checked against the runtime as a new
    job's is (upstream re-validates every update). An update that leaves the spec alone
    (labels, finalizers) is not judged again: a runtime deleted since must not hold up a
    finalizer's removal."""
    problems = check_managed_by(new["spec"])
    was, now = managed_by(old["spec"]), managed_by(new["spec"])
    if was != now:
        problems.append(Problem("spec.managedBy", f"field is immutable (was {_show_managed(was)}, "
                                                  f"now {_show_managed(now)})", INVALID))
    problems += check_patch_managers(new["spec"])
    problems += check_overrides_change(old, new, namespace, name, lookups)
    problems += check_runtime_patches_change(old, new, namespace, name, lookups)
    if old["spec"] != new["spec"] and operator_manages(now):
        problems += check_trainer(new["spec"])
        problems += check_against_runtime(new, namespace, lookups, problems,
                                          missing_is_refused=False)
    return _unique(problems)


def _show_managed(value: Any) -> str:
    return "unset" if value == "" else _show(value)


def check_managed_by(spec: dict) -> list[Problem]:
    value = managed_by(spec)
    if allowed(value):
        return []
    return [Problem("spec.managedBy", f"unsupported value {_show(value)}: must be one of "
                                      f"{', '.join(ALLOWED_VALUES)}, or unset",
                    NOT_SUPPORTED)]


def check_name(job: dict) -> list[Problem]:
    metadata = job["metadata"]
    name = metadata.get("name")
    if name is None or name == "":
        if _str(metadata.get("generateName")):
            return []  # generated later by the apiserver; nothing to judge yet
        return [Problem("metadata.name", "must be set")]
    if not isinstance(name, str):
        return [Problem("metadata.name", f"must be a string, got {_type(name)}")]
    reasons = []
    if len(name) > DNS1035_MAX_LENGTH:
        reasons.append(f"must be no more than {DNS1035_MAX_LENGTH} characters "
                       f"(has {len(name)})")
    if not DNS1035_LABEL.fullmatch(name):
        reasons.append("must consist of lower case alphanumeric characters or '-', start with "
                       "an alphabetic character and end with an alphanumeric character")
    if not reasons:
        return []
    return [Problem("metadata.name", f"{_show(name)} is not a valid DNS-1035 label (the "
                                     f"JobSet's Service is named after it): "
                                     f"{' and '.join(reasons)}")]


def check_trainer(spec: dict) -> list[Problem]:
    trainer = spec.get("trainer")
    if trainer is None:
        return []
    if not isinstance(trainer, dict):
        return [Problem("spec.trainer", f"must be an object, got {_type(trainer)}")]
    problems = []
    nodes = trainer.get("numNodes")
    if nodes is not None and not (_is_int(nodes) and nodes >= 1):
        problems.append(Problem("spec.trainer.numNodes",
                                f"{_show(nodes)}: must be an integer >= 1"))
    procs = trainer.get("numProcPerNode")
    if procs is not None and not _valid_num_proc(procs):
        problems.append(Problem("spec.trainer.numProcPerNode",
                                f"{_show(procs)}: must be auto, cpu, gpu or a positive integer",
                                NOT_SUPPORTED))
    problems += check_unshared_resources(trainer.get("resourcesPerNode"))
    return problems


# The API lets pods share (overcommit) only these; any other resource (GPUs, other extended
# resources, hugepages) needs a limit equal to its request, or the Job is refused.
OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def check_unshared_resources(resources: Any) -> list[Problem]:
    """A request the pod's Job could never carry: a resource that is not overcommittable,
    without a limit equal to it. Caught here, the TrainJob is refused; missed, the JobSet
    controller retries the refused Job forever and the TrainJob shows nothing."""
    if not isinstance(resources, dict):
        return []
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if not isinstance(requests, dict) or not isinstance(limits, dict):
        return []
    problems = []
    for name, amount in requests.items():
        if name in OVERCOMMITTABLE:
            continue
        limit = limits.get(name)
        if limit is None:
            problems.append(Problem(f"spec.trainer.resourcesPerNode.limits[{name}]",
                                    f"required, equal to the request ({_str(amount)}): {name} "
                                    "cannot be overcommitted"))
        elif _quantity(limit) != _quantity(amount):
            problems.append(Problem(f"spec.trainer.resourcesPerNode.limits[{name}]",
                                    f"{_str(limit)} must equal the request ({_str(amount)}): "
                                    f"{name} cannot be overcommitted"))
    return problems


def _quantity(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        return value  # the CRD refuses what is not a quantity; compare as given


def _valid_num_proc(value: Any) -> bool:
    if _is_int(value):
        return value >= 1
    if isinstance(value, str):
        return value in PROC_WORDS or (POSITIVE_INTEGER.fullmatch(value) is not None
                                       and int(value) >= 1)
    return False


def check_overrides_change(old: dict, new: dict, namespace: str, name: str,
                           lookups: Lookups) -> list[Problem]:
    """podSpecOverrides change only while suspended and the JobSet is idle,
    because a queueing system injects scheduling constraints into a suspended job."""
    before = old["spec"].get("podSpecOverrides") or []
    after = new["spec"].get("podSpecOverrides") or []
    if before == after:
        return []
    field = "spec.podSpecOverrides"
    if new["spec"].get("suspend") is not True:
        return [Problem(field, "may change only while the TrainJob is suspended "
                               "(spec.suspend is not true)", FORBIDDEN)]
    return _while_jobset_idle(field, namespace, name, lookups)


def check_patch_managers(spec: dict) -> list[Problem]:
    """Each runtime patch names its manager as a domain-prefixed path (``example.com/queue``),
    as upstream requires, so two managers' patches never share a name by accident."""
    problems = []
    for i, patch in enumerate(spec.get("runtimePatches") or []):
        manager = patch.get("manager") if isinstance(patch, dict) else None
        domain, slash, rest = manager.partition("/") if isinstance(manager, str) else ("", "", "")
        if not (slash and DNS1123_SUBDOMAIN.fullmatch(domain) and len(domain) <= 253
                and DOMAIN_PATH_REST.fullmatch(rest)):
            # Upstream names the field without the entry's index; the reason gives it.
            problems.append(Problem("spec.runtimePatches.manager",
                                    f"runtimePatches[{i}]: {_show(manager)} must be a "
                                    "domain-prefixed path such as example.com/queue"))
    return problems


def check_runtime_patches_change(old: dict, new: dict, namespace: str, name: str,
                                 lookups: Lookups) -> list[Problem]:
    """runtimePatches change only when the job is suspended before or after the update
    (upstream's rule: Kueue injects and unsuspends in one request) and the JobSet is idle."""
    if (old["spec"].get("runtimePatches") or []) == (new["spec"].get("runtimePatches") or []):
        return []
    field = "spec.runtimePatches"
    if old["spec"].get("suspend") is not True and new["spec"].get("suspend") is not True:
        return [Problem(field, "may change only when the TrainJob is suspended before or "
                               "after the update (spec.suspend is not true in either)",
                        FORBIDDEN)]
    return _while_jobset_idle(field, namespace, name, lookups)


def _while_jobset_idle(field: str, namespace: str, name: str,
                       lookups: Lookups) -> list[Problem]:
    jobset = _lookup(lambda: lookups.jobset(namespace, name), f"JobSet {namespace}/{name}")
    active = active_replicated_jobs(jobset)
    if not active:
        return []
    names = ", ".join(active)
    still = (f"replicated job {names} still has active pods" if len(active) == 1
             else f"replicated jobs {names} still have active pods")
    return [Problem(field, f"may change only while JobSet {namespace}/{name} has no active "
                           f"replicated job: {still}", FORBIDDEN)]


def active_replicated_jobs(jobset: Any) -> list[str]:
    """Names of the JobSet's replicated jobs with ``active > 0`` (none for a missing JobSet)."""
    if not isinstance(jobset, dict):
        return []
    status = jobset.get("status")
    entries = status.get("replicatedJobsStatus") if isinstance(status, dict) else None
    names = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        active = entry.get("active")
        if _is_int(active) and active > 0:
            names.append(_show(entry.get("name")) if not isinstance(entry.get("name"), str)
                         else entry["name"])
    return names


# --- checks against the runtime --------------------------------------------------------------


def check_against_runtime(job: dict, namespace: str, lookups: Lookups,
                          earlier: list[Problem], missing_is_refused: bool = True) -> list[Problem]:
    """The runtime exists, overrides and initializers fit it, and the policy plug-ins agree.
    ``missing_is_refused`` False: a runtime that does not exist is no problem (an update of
    a job whose runtime was deleted since)."""
    spec = job["spec"]
    ref = spec.get("runtimeRef")
    if not isinstance(ref, dict):
        return [Problem("spec.runtimeRef", "must be set to the runtime this job runs on")]
    try:
        key = runtime_ref.runtime_key(ref, namespace)
    except runtime_ref.UnsupportedRuntimeRef as err:
        cause = INVALID if err.field.endswith(".name") else NOT_SUPPORTED
        return [Problem(err.field, err.reason, cause)]
    kind, name, described = key.kind, key.name, str(key)
    runtime = _lookup(lambda: lookups.runtime(namespace, kind, name), described)
    if runtime is None:
        if not missing_is_refused:
            return []
        # Invalid, as upstream: the reference does not resolve.
        return [Problem("spec.runtimeRef", f"{described} not found: create the runtime "
                                           "before the TrainJob")]

    jobs = _replicated_jobs(runtime)
    problems = check_overrides(spec, jobs, described)
    problems += check_initializers(spec, jobs, described)
    problems += check_runtime_patches(spec, jobs, described)
    refused = {p.field for p in earlier + problems}
    # A plug-in may refuse a field the core already refused (numProcPerNode): say it once.
    problems += [p for p in check_policies(job, runtime, described, bool(refused))
                 if p.field not in refused]
    if "metadata.name" not in refused:
        problems += check_name_room(job, runtime, described)
    problems += [Problem(field, reason) for field, reason in priority_classes.problems(
        runtime, lambda name: lookups.priority_class(name) is not None)]
    return problems


def check_name_room(job: dict, runtime: dict, described: str) -> list[Problem]:
    """The name leaves room for every child the JobSet controller names after it."""
    from trainjob.api import TrainingRuntime, TrainJob
    from trainjob.runtime import build_runtime_info
    from trainjob.runtime.child_names import name_room

    name = job["metadata"].get("name")
    if not isinstance(name, str) or not name:
        return []  # generateName: the apiserver picks a name that is not ours to judge
    try:
        info = build_runtime_info(TrainJob.model_validate(job),
                                  TrainingRuntime.model_validate(runtime))
    except Exception:  # noqa: BLE001 - check_policies reports a runtime that cannot apply
        return []
    tightest = name_room(info)
    if tightest is None or len(name) <= tightest.room:
        return []
    example = tightest.pattern.replace("{name}", name)
    return [Problem("metadata.name", f"{_show(name)} has {len(name)} characters; on "
                                     f"{described} at most {tightest.room} fit: the JobSet "
                                     f"controller names a {tightest.kind} {example}, which "
                                     f"must be at most 63 characters")]


def _replicated_jobs(runtime: Any) -> dict[str, dict]:
    """The runtime template's replicated jobs by name (malformed entries skipped)."""
    template = _path(runtime, "spec", "template", "spec")
    entries = template.get("replicatedJobs") if isinstance(template, dict) else None
    jobs: dict[str, dict] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            jobs.setdefault(entry["name"], entry)
    return jobs


def _container_names(replicated_job: dict, key: str) -> list[str]:
    containers = _path(replicated_job, "template", "spec", "template", "spec", key)
    if not isinstance(containers, list):
        return []
    return [x["name"] for x in containers
            if isinstance(x, dict) and isinstance(x.get("name"), str)]


def check_overrides(spec: dict, jobs: dict[str, dict], described: str) -> list[Problem]:
    overrides = spec.get("podSpecOverrides")
    if overrides is None:
        return []
    if not isinstance(overrides, list):
        return [Problem("spec.podSpecOverrides", f"must be a list, got {_type(overrides)}")]
    problems = []
    known = ", ".join(jobs) or "none"
    for i, override in enumerate(overrides):
        base = f"spec.podSpecOverrides[{i}]"
        if not isinstance(override, dict):
            problems.append(Problem(base, f"must be an object, got {_type(override)}"))
            continue
        targets = override.get("targetJobs")
        if not isinstance(targets, list) or not targets:
            problems.append(Problem(f"{base}.targetJobs", "must list at least one replicated job"))
            continue
        seen: set[str] = set()
        resolved = []
        for j, target in enumerate(targets):
            field = f"{base}.targetJobs[{j}].name"
            job_name = target.get("name") if isinstance(target, dict) else None
            if not isinstance(job_name, str) or not job_name:
                problems.append(Problem(field, "must name a replicated job"))
                continue
            if job_name in seen:
                problems.append(Problem(field, f"duplicate replicated job {_show(job_name)}: "
                                               f"each job may appear once per override",
                                        DUPLICATE))
                continue
            seen.add(job_name)
            if job_name not in jobs:
                problems.append(Problem(field, f"replicated job {_show(job_name)} not found in "
                                               f"{described} (it has: {known})", NOT_FOUND))
                continue
            resolved.append(job_name)
        for key in ("containers", "initContainers"):
            problems += _check_override_containers(override, key, base, resolved, jobs)
    return problems


def _check_override_containers(override: dict, key: str, base: str, targets: list[str],
                               jobs: dict[str, dict]) -> list[Problem]:
    items = override.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        return [Problem(f"{base}.{key}", f"must be a list, got {_type(items)}")]
    kind = "container" if key == "containers" else "init container"
    problems = []
    for k, item in enumerate(items):
        field = f"{base}.{key}[{k}].name"
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            problems.append(Problem(field, f"must name a {kind}"))
            continue
        for target in targets:
            present = _container_names(jobs[target], key)
            if name not in present:
                problems.append(Problem(
                    field, f"{kind} {_show(name)} not found in replicated job {_show(target)} "
                           f"(it has: {', '.join(present) or 'none'})", NOT_FOUND))
    return problems


# The volume an initializer writes to and the trainer reads from (upstream's name).
INITIALIZER_VOLUME = "initializer"

# Containers whose environment only the trainer and initializer settings may set (upstream).
ENV_OWNED_CONTAINERS = (c.NODE, c.DATASET_INITIALIZER, c.MODEL_INITIALIZER)


def check_runtime_patches(spec: dict, jobs: dict[str, dict], described: str) -> list[Problem]:
    """Each patched replicated job and container exists in the runtime, and no patch sets the
    env of a container that the trainer or initializer settings own."""
    problems = []
    for i, patch in enumerate(spec.get("runtimePatches") or []):
        base = f"[{i}].trainingRuntimeSpec.template.spec.replicatedJobs"
        for j, job_patch in enumerate(_path(patch, "trainingRuntimeSpec", "template", "spec",
                                            "replicatedJobs") or []):
            job_name = job_patch.get("name") if isinstance(job_patch, dict) else None
            if job_name not in jobs:
                problems.append(_patch_problem(f"{base}[{j}].name: replicated job "
                                               f"{_show(job_name)} not found in {described} "
                                               f"(it has: {', '.join(jobs) or 'none'})"))
                continue
            pod = _path(job_patch, "template", "spec", "template", "spec") or {}
            present = set(_container_names(jobs[job_name], "containers")) | set(
                _container_names(jobs[job_name], "initContainers"))
            for key in ("initContainers", "containers"):
                for k, item in enumerate(pod.get(key) or []):
                    field = f"{base}[{j}].template.spec.template.spec.{key}[{k}]"
                    cname = item.get("name") if isinstance(item, dict) else None
                    if cname not in present:
                        problems.append(_patch_problem(
                            f"{field}.name: container {_show(cname)} not found in replicated "
                            f"job {_show(job_name)}"))
                    elif key == "containers" and item.get("env") and \
                            cname in ENV_OWNED_CONTAINERS:
                        problems.append(_patch_problem(
                            f"{field}.env: the {cname} container's env is set through "
                            "spec.trainer or spec.initializer, not a runtime patch"))
    return problems


def _patch_problem(where_and_why: str) -> Problem:
    """Upstream refuses a patch at spec.runtimePatches as a whole (Invalid); the reason says
    which entry, from ``[i]`` on."""
    return Problem("spec.runtimePatches", f"spec.runtimePatches{where_and_why}")


def check_initializers(spec: dict, jobs: dict[str, dict], described: str) -> list[Problem]:
    initializer = spec.get("initializer")
    if initializer is None:
        return []
    if not isinstance(initializer, dict):
        return [Problem("spec.initializer", f"must be an object, got {_type(initializer)}")]
    # Upstream's rules, each a refusal of spec.runtimeRef (the runtime cannot run what the
    # job asks): the runtime has a job named after the initializer, with a container of that
    # name, mounting the shared volume the trainer reads what it fetched from.
    problems = []
    for key, name in (("dataset", c.DATASET_INITIALIZER), ("model", c.MODEL_INITIALIZER)):
        if initializer.get(key) is None:
            continue
        where = f"{described} (for spec.initializer.{key})"
        if name not in jobs:
            problems.append(Problem("spec.runtimeRef", f"{where} has no {name} replicated job"))
            continue
        containers = _path(jobs[name], "template", "spec", "template", "spec", "containers")
        container = next((x for x in containers if isinstance(x, dict) and x.get("name") == name),
                         None) if isinstance(containers, list) else None
        mounts = container.get("volumeMounts") if container is not None else None
        if container is None:
            problems.append(Problem("spec.runtimeRef", f"{where}: the {name} job has no "
                                                       f"container {name}"))
        elif not (isinstance(mounts, list) and any(
                isinstance(m, dict) and m.get("name") == INITIALIZER_VOLUME for m in mounts)):
            problems.append(Problem("spec.runtimeRef", f"{where}: container {name} of the "
                                    f"{name} job must mount volume {INITIALIZER_VOLUME!r}, where "
                                    "it puts what it fetches for the trainer"))
    return problems


def check_policies(job: dict, runtime: dict, described: str,
                   already_refused: bool) -> list[Problem]:
    """What the runtime's policy plug-ins (torch, mpi, ...) refuse in this job."""
    from pydantic import ValidationError

    from trainjob.api import TrainingRuntime, TrainJob
    from trainjob.runtime import build_runtime_info, validate_policies

    try:
        model = TrainJob.model_validate(job)
    except ValidationError as err:
        return [] if already_refused else _validation_problems(err, "")
    try:
        runtime_model = TrainingRuntime.model_validate(runtime)
        info = build_runtime_info(model, runtime_model)
        found = validate_policies(info, model)
    except Exception as err:  # noqa: BLE001 - a plug-in choking on the job is a refusal
        if already_refused:
            return []  # the job is refused anyway; the earlier problems say why
        return [Problem("spec.runtimeRef", f"{described} cannot be applied to this job: "
                                           f"{type(err).__name__}: {_short(err)}")]
    return [Problem(str(field), str(reason), CAUSES.get(str(kind[0]) if kind else "", INVALID))
            for field, reason, *kind in found]


def _validation_problems(err: Any, prefix: str) -> list[Problem]:
    problems = []
    for error in err.errors()[:10]:
        loc = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in error["loc"])
        problems.append(Problem(f"{prefix}{loc}".replace(".[", "["), error["msg"]))
    return problems


# --- small helpers ---------------------------------------------------------------------------


def _lookup(read, described: str):
    try:
        return read()
    except Exception as err:  # fail closed with the reason
        raise _LookupFailed(f"cannot read {described}: {type(err).__name__}: "
                            f"{_short(err)}") from err


def _unique(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


def _path(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "a value")


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _short(err: BaseException) -> str:
    try:
        text = str(err).replace("\n", " ")
    except Exception:  # noqa: BLE001 - an exception whose str() fails still gets an answer
        text = type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."
