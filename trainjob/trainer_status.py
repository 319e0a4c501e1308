"""``status.trainerStatus``: the trainer's own report of its progress, as upstream Kubeflow
Trainer v2.3 (feature gate ``TrainJobStatus``, alpha) defines it. Pure functions and the
names both ends agree on; the HTTPS endpoint is the operator's ``status_server``, the pod
wiring its ``TrainerStatusPlugin``.

A trainer pod POSTs ``{"trainerStatus": {...}}`` to ``status_path(namespace, name)`` with a
projected service-account token whose audience is ``token_audience(namespace, name)``.
The request is read the way upstream's server decodes it (unknown fields ignored, numbers
must be integers, ``lastUpdatedTime`` an RFC 3339 time) and checked against the CRD's rules,
so a refusal names the field before anything is written.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from controller_kit.api_time import format_time
from trainjob import constants as c

# Upstream's names: a training library written for upstream finds the same ones here.
AUDIENCE_PREFIX = "trainer.kubeflow.org"
FIELD_MANAGER = "trainer-status"
ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
CA_CERT_FILE = "ca.crt"
TOKEN_FILE = "token"
VOLUME_NAME = "kubeflow-trainer-token"
TOKEN_EXPIRY_SECONDS = 3600
CONFIGMAP_SUFFIX = "-tls-config"
DEFAULT_PORT = 10443
MAX_BODY_BYTES = 1 << 16  # upstream's limit: 64 KiB

# The CRD's limits (manifests/crds, same as upstream's).
MAX_PERCENT = 100
MAX_METRICS = 256
MAX_METRIC_TEXT = 64
INT32_MAX = 2**31 - 1

_PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/"
                   r"([^/]+)/status$")


def token_audience(namespace: str, name: str) -> str:
    """The audience a pod's token must carry to report on TrainJob ``namespace/name``."""
    return f"{AUDIENCE_PREFIX}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_path(namespace: str, name: str) -> str:
    """The endpoint's path for TrainJob ``namespace/name``."""
    return (f"/apis/{c.TRAINER_GROUP}/{c.TRAINER_VERSION}/namespaces/{namespace}/trainjobs/"
            f"{name}/status")


def parse_status_path(path: str) -> tuple[str, str] | None:
    """(namespace, name) of a status path, else None."""
    found = _PATH.match(path)
    return (found.group(1), found.group(2)) if found else None


def configmap_name(job_name: str) -> str:
    """The ConfigMap holding the endpoint's CA certificate for the job's pods."""
    return f"{job_name}{CONFIGMAP_SUFFIX}"


class InvalidUpdate(ValueError):
    """A request that cannot be written; ``problems`` are (field path, reason) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {reason}" for field, reason in problems))


def _integer(value: Any, field: str, minimum: int, maximum: int,
             problems: list[tuple[str, str]]) -> int | None:
    # bool is an int in Python, not in JSON; 50.0 is a number Go will not put in an int32.
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((field, f"must be an integer, not {_json_type(value)}"))
        return None
    if not minimum <= value <= maximum:
        problems.append((field, f"must be between {minimum} and {maximum}, not {value}"))
        return None
    return value


def _text(value: Any, field: str, problems: list[tuple[str, str]]) -> str | None:
    if value is None:
        problems.append((field, "is required"))
        return None
    if not isinstance(value, str):
        problems.append((field, f"must be a string, not {_json_type(value)}"))
        return None
    if not 1 <= len(value) <= MAX_METRIC_TEXT:
        problems.append((field, f"must be 1 to {MAX_METRIC_TEXT} characters, not {len(value)}"))
        return None
    return value


def _time(value: Any, field: str, problems: list[tuple[str, str]]) -> str | None:
    if value is None:
        problems.append((field, "is required when trainerStatus is present"))
        return None
    if not isinstance(value, str):
        problems.append((field, f"must be an RFC 3339 time string, not {_json_type(value)}"))
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or "T" not in value.upper():
        problems.append((field, f"must be an RFC 3339 time with a zone, e.g. "
                                f"2025-01-31T12:00:00Z, not {value[:40]!r}"))
        return None
    # Stored as Kubernetes stores a metav1.Time: UTC, whole seconds.
    return format_time(parsed.timestamp())


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def trainer_status_from_request(body: Any) -> dict[str, Any] | None:
    """The ``trainerStatus`` to write from a decoded request body, or None when the body
    carries none (nothing to write, as upstream). Raises ``InvalidUpdate`` naming every
    field that breaks the CRD's rules."""
    if not isinstance(body, dict):
        raise InvalidUpdate([("(body)", f"must be a JSON object, not {_json_type(body)}")])
    raw = body.get("trainerStatus")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidUpdate([("trainerStatus", f"must be an object, not {_json_type(raw)}")])
    problems: list[tuple[str, str]] = []
    status: dict[str, Any] = {}
    if raw.get("progressPercentage") is not None:
        value = _integer(raw["progressPercentage"], "trainerStatus.progressPercentage", 0,
                         MAX_PERCENT, problems)
        if value is not None:
            status["progressPercentage"] = value
    if raw.get("estimatedRemainingSeconds") is not None:
        value = _integer(raw["estimatedRemainingSeconds"],
                         "trainerStatus.estimatedRemainingSeconds", 0, INT32_MAX, problems)
        if value is not None:
            status["estimatedRemainingSeconds"] = value
    metrics = raw.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, list):
            problems.append(("trainerStatus.metrics", f"must be a list, not {_json_type(metrics)}"))
        elif len(metrics) > MAX_METRICS:
            problems.append(("trainerStatus.metrics",
                             f"must have at most {MAX_METRICS} items, not {len(metrics)}"))
        else:
            written = []
            for i, metric in enumerate(metrics):
                field = f"trainerStatus.metrics[{i}]"
                if not isinstance(metric, dict):
                    problems.append((field, f"must be an object, not {_json_type(metric)}"))
                    continue
                name = _text(metric.get("name"), f"{field}.name", problems)
                value = _text(metric.get("value"), f"{field}.value", problems)
                if name is not None and value is not None:
                    written.append({"name": name, "value": value})
            if written:
                status["metrics"] = written
    updated = _time(raw.get("lastUpdatedTime"), "trainerStatus.lastUpdatedTime", problems)
    if updated is not None:
        status["lastUpdatedTime"] = updated
    if problems:
        raise InvalidUpdate(problems)
    return status


def apply_body(namespace: str, name: str, trainer_status: dict[str, Any]) -> dict[str, Any]:
    """The server-side apply of ``status.trainerStatus`` alone. Applied with one field
    manager every time, a field the trainer no longer sends is removed."""
    return {
        "apiVersion": c.TRAINER_API_VERSION,
        "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"trainerStatus": trainer_status},
    }
