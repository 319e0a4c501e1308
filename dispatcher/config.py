"""Dispatcher configuration: a pydantic model loaded from a YAML file, overridden by flags.

Invalid configuration fails at start with a message naming the key, e.g.
``config key 'client.qps': Input should be greater than 0``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controller_kit import listeners
from controller_kit.gc_pauses import SWEEP_SECONDS
from controller_kit.yaml_errors import YamlFileError, read_yaml_mapping
from trainjob.constants import DEFAULT_ORIGIN, KUEUE_DEFAULT_ORIGIN, KUEUE_NAMESPACE

# Kueue can be installed or removed (on the manager or a worker) while the dispatcher runs:
# whoever reads it and found none looks again this often.
KUEUE_RECHECK_SECONDS = 30.0

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# Kueue's rule for multiKueue.dispatcherName: a DNS subdomain, "/", a path.
_DISPATCHER_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9._~!$&'()*+,;=:@%/-]+$")
DEFAULT_DISPATCHER_NAME = "trainjob-dispatcher.io/capacity"
# The dashboard's own listener, used whenever metrics and health are not on loopback.
DEFAULT_DASHBOARD_HOST = "127.0.0.1"
DEFAULT_DASHBOARD_PORT = 8082
# Plain metrics and health, as run by hand; with metrics_secure, controller_kit/listeners.py's.
PLAIN_METRICS_PORT = 8081


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the reason."""


class _Strict(BaseModel):
    # inf and nan are numbers to YAML; no duration or rate here may be either.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ClientLimits(_Strict):
    """Per-worker client rate limit. Generous by default: MultiKueue users hit 5 QPS per
    worker and waited 15 minutes for 1,000 jobs."""

    qps: float = Field(200.0, gt=0)
    burst: int = Field(400, ge=1)
    timeout_seconds: float = Field(
        30.0, gt=0, description="a request to a worker that gets no answer within this long "
                                "fails and is retried with backoff")


class ManagerClientLimits(_Strict):
    """Rate limit of the client to the manager cluster. None by default: the manager's
    apiserver has its own priority and fairness, and every dispatch writes there; a limit
    is for sharing a manager with others, or for comparing with a controller that has one."""

    qps: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1, description="default: the qps, at least 1")


class StaticWorker(_Strict):
    """A worker given in the file, for setups without MultiKueueCluster objects."""

    name: str = Field(min_length=1)
    kubeconfig: Path


class DispatcherConfig(_Strict):
    mode: Literal["standalone", "kueue"] = Field(
        "standalone", description="standalone: claim and mirror TrainJobs itself; kueue: "
                                  "nominate workers for Kueue MultiKueue's Workloads")
    dispatcher_name: str = Field(
        DEFAULT_DISPATCHER_NAME, max_length=63,
        description="kueue mode: the multiKueue.dispatcherName Kueue is configured with")
    admission_timeout_seconds: float = Field(
        300.0, gt=0, description="kueue mode: how long a nominated worker's Kueue may take "
                                 "to admit before the next worker is nominated")
    namespace: str = Field("kueue-system", min_length=1,
                           description="the dispatcher's own namespace: its Lease and the "
                                       "worker kubeconfig Secrets it reads (in kueue mode "
                                       "its own, never Kueue's)")
    kueue_namespace: str = Field(
        KUEUE_NAMESPACE, min_length=1,
        description="Kueue's namespace: where its Configuration ConfigMap is read")
    multikueue_config: str | None = Field(
        None, description="MultiKueueConfig naming the candidate clusters; all when unset")
    origin: str | None = Field(
        None, min_length=1, max_length=63,
        description="value of the kueue.x-k8s.io/multikueue-origin label; default "
                    f"{DEFAULT_ORIGIN} in standalone mode, Kueue's default "
                    f"{KUEUE_DEFAULT_ORIGIN} in kueue mode (where it must be Kueue's)")
    workers: list[StaticWorker] = Field(default_factory=list)
    kubeconfig_dirs: list[Path] = Field(
        default_factory=list,
        description="the directories a MultiKueueCluster's Path kubeConfig location may be "
                    "in; none: Path locations are refused")
    client: ClientLimits = Field(default_factory=ClientLimits)
    manager_client: ManagerClientLimits = Field(default_factory=ManagerClientLimits)
    placement_policy: Literal["best-fit", "worst-fit", "first-fit"] = "best-fit"
    node_scoring: Literal["LeastAllocated", "MostAllocated"] = Field(
        "LeastAllocated",
        description="the workers' kube-scheduler NodeResourcesFit scoring strategy: which "
                    "Node each pod of a job is expected on when checking that every pod fits")
    gc_interval_seconds: float = Field(60.0, ge=0, description="0 disables the sweep")
    python_gc_sweep_seconds: float = Field(
        SWEEP_SECONDS, ge=0, description="between full collections of the interpreter's "
        "frozen objects after the one at start (docs/metrics.md); 0: none")
    worker_lost_timeout_seconds: float = Field(900.0, gt=0)
    retention_seconds: float = Field(
        0.0, ge=0, description="standalone mode: how long every finished job's copy (and so "
        "its Pods, their Events and logs) is kept on its worker after the job finished, "
        "readable from the manager through the remote view; 0: deleted as soon as the "
        "manager shows the finished status (docs/remote-view.md#after-a-job-finishes)")
    failed_retention_seconds: float = Field(
        900.0, ge=0, description="standalone mode: how long a Failed job's copy is kept "
        "(at least retention_seconds), so that why it failed stays readable; finished Pods "
        "hold no room on their Nodes, only their API objects and logs")
    mirror_worker_events: bool = Field(
        True, description="show the Warning Events of each job's copy (the dispatcher's, or "
                          "Kueue's in Kueue mode) and its Pods on the worker as Events of the "
                          "manager's TrainJob (docs/design.md#the-workers-reasons-on-the-manager)")
    worker_event_watches: int = Field(
        20, ge=0, description="mirror_worker_events: the namespaces of a worker whose Warning "
        "Events are watched at most (a connection and a thread each); those of more "
        "namespaces with copies are listed every worker_event_list_seconds instead, until a "
        "watch is free (dispatcher_worker_event_namespaces_over_limit counts them)")
    worker_event_list_seconds: float = Field(
        30.0, gt=0, description="mirror_worker_events: how often a worker namespace's Warning "
        "Events are listed when not watched (over worker_event_watches, or its last copy "
        "gone a moment ago)")
    worker_event_qps: float = Field(
        10.0, gt=0, description="mirror_worker_events: rate limit of the requests that read a "
        "worker's Warning Events, a client of their own apart from client.qps")
    worker_event_burst: int | None = Field(
        None, ge=1, description="default: twice worker_event_qps, at least 1")
    leader_elect: bool = Field(True, description="use a Lease so only one replica writes")
    lease_duration_seconds: float = Field(15.0, gt=0)
    renew_deadline_seconds: float = Field(10.0, gt=0)
    retry_period_seconds: float = Field(2.0, gt=0)
    metrics_host: str = Field(
        listeners.DEFAULT_HOST, min_length=1,
        description=f"{listeners.EVERY_INTERFACE}: every interface, IPv6 and IPv4")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description=f"default {PLAIN_METRICS_PORT}, or "
                                          f"{listeners.SECURE_METRICS_PORT} with metrics_secure")
    metrics_secure: bool = Field(
        False, description="HTTPS, each request's bearer token authenticated (TokenReview) "
                           "and authorized for get /metrics (SubjectAccessReview)")
    metrics_cert_dir: Path | None = Field(
        None, description="tls.crt and tls.key for metrics_secure; default: self-signed")
    health_probe_host: str | None = Field(
        None, min_length=1, description="default: metrics_host")
    health_probe_port: int | None = Field(
        None, ge=0, le=65535, description="/healthz and /readyz on a listener of their own; "
                                          f"default: beside /metrics, "
                                          f"{listeners.HEALTH_PROBE_PORT} with metrics_secure")
    metrics_cert_validity_seconds: float | None = Field(
        None, description="life of the self-signed metrics certificate, renewed at 2/3 of it; "
                          f"default {listeners.METRICS_CERT_VALIDITY_SECONDS:.0f}")
    metrics_auth_qps: float | None = Field(
        None, description="tokens checked with the apiserver per second by the secure "
                          f"metrics listener; default {listeners.metrics_auth.REVIEW_QPS:g}")
    liveness_stall_timeout_seconds: float | None = Field(
        None, description="/healthz fails once keys wait this long with no reconcile worker "
                          "taking any; 0: never; default "
                          f"{listeners.LIVENESS_STALL_TIMEOUT_SECONDS:.0f}")
    dashboard_host: str | None = Field(
        None, min_length=1, description=f"default {DEFAULT_DASHBOARD_HOST}; see "
                                        "dashboard_address")
    dashboard_port: int | None = Field(
        None, ge=0, le=65535, description=f"default {DEFAULT_DASHBOARD_PORT}; see "
                                          "dashboard_address")
    # The remote view (dispatcher/remote_view, docs/remote-view.md): off without a port.
    remote_api_port: int | None = Field(None, ge=0, le=65535)
    remote_api_host: str = Field("127.0.0.1", min_length=1)
    remote_api_cert_dir: Path | None = None
    remote_api_service: str = Field("trainjob-dispatcher-remote-api", min_length=1)
    remote_api_max_streams: int = Field(50, ge=1)
    remote_api_stream_idle_timeout_seconds: float = Field(300.0, gt=0)

    @property
    def worker_secrets_namespace(self) -> str:
        """Where the kubeconfig Secrets MultiKueueClusters name are read, in both modes: the
        dispatcher's own namespace. In kueue mode Kueue keeps Secrets of those names in its
        namespace, holding Kueue's identity on each worker, which may create jobs there;
        the dispatcher only reads a worker and has Secrets of its own, of the same names."""
        return self.namespace

    def dashboard_address(self) -> tuple[str, int] | None:
        """Where the dashboard (``/`` and ``/api/state``, which show every job and cluster)
        listens on its own; None when it shares the metrics and health listener, which it
        does only when that listener is plain HTTP on loopback and no dashboard address was
        given. Metrics on every interface (in a Pod, for scraping) or behind authentication
        never take the dashboard with them."""
        if self.dashboard_host is None and self.dashboard_port is None \
                and not self.metrics_secure and is_loopback(self.metrics_host):
            return None
        return (self.dashboard_host or DEFAULT_DASHBOARD_HOST,
                DEFAULT_DASHBOARD_PORT if self.dashboard_port is None else self.dashboard_port)

    @model_validator(mode="after")
    def _origin_by_mode(self) -> DispatcherConfig:
        if self.origin is None:
            self.origin = DEFAULT_ORIGIN if self.mode == "standalone" else KUEUE_DEFAULT_ORIGIN
        return self

    @model_validator(mode="after")
    def _own_secrets_in_kueue_mode(self) -> DispatcherConfig:
        # The same names in the same namespace would be Kueue's Secrets, with Kueue's
        # write access to every worker: the dispatcher must never hold those.
        if self.mode == "kueue" and self.namespace == self.kueue_namespace:
            raise ValueError(
                f"mode kueue needs namespace to differ from kueue_namespace (both "
                f"{self.namespace}): the worker kubeconfig Secrets are read in namespace, by "
                "the names the MultiKueueClusters give, and in kueue_namespace those are "
                "Kueue's own Secrets, which can write to every worker; give the dispatcher "
                "one of its own (the shipped Deployment runs in trainjob-system), holding a "
                "read-only kubeconfig for each worker")
        return self

    def metrics_listeners(self) -> listeners.Listeners:
        """Where metrics and the health probes are served."""
        default = listeners.Listeners()
        return listeners.Listeners(
            metrics_host=self.metrics_host, metrics_port=self.metrics_port or 0,
            metrics_secure=self.metrics_secure, metrics_cert_dir=self.metrics_cert_dir,
            health_probe_host=self.health_probe_host, health_probe_port=self.health_probe_port,
            metrics_cert_validity_seconds=_or(self.metrics_cert_validity_seconds,
                                              default.metrics_cert_validity_seconds),
            metrics_auth_qps=_or(self.metrics_auth_qps, default.metrics_auth_qps),
            liveness_stall_timeout_seconds=_or(self.liveness_stall_timeout_seconds,
                                               default.liveness_stall_timeout_seconds))

    @model_validator(mode="after")
    def _listeners(self) -> DispatcherConfig:
        # The rules across the metrics and probe keys are the operator's too; the refusal
        # names the keys (flags, where flags gave them: _describe).
        where = listeners.resolve(
            plain_metrics_port=PLAIN_METRICS_PORT, metrics_host=self.metrics_host,
            metrics_port=self.metrics_port, metrics_secure=self.metrics_secure,
            metrics_cert_dir=self.metrics_cert_dir, health_probe_host=self.health_probe_host,
            health_probe_port=self.health_probe_port,
            metrics_cert_validity_seconds=self.metrics_cert_validity_seconds,
            metrics_auth_qps=self.metrics_auth_qps,
            liveness_stall_timeout_seconds=self.liveness_stall_timeout_seconds,
            names={k: k for k in listeners.FLAGS})
        self.metrics_port = where.metrics_port
        self.health_probe_host, self.health_probe_port = (where.health_probe_host,
                                                          where.health_probe_port)
        return self

    @model_validator(mode="after")
    def _lease_timings(self) -> DispatcherConfig:
        if self.leader_elect and not (self.lease_duration_seconds > self.renew_deadline_seconds
                                      > 1.2 * self.retry_period_seconds):
            raise ValueError(
                "renew_deadline_seconds must be less than lease_duration_seconds and more than "
                "1.2 x retry_period_seconds (a leader must stop before a standby may start)")
        return self

    @field_validator("dispatcher_name")
    @classmethod
    def _domain_path(cls, value: str) -> str:
        if not _DISPATCHER_NAME.match(value):
            raise ValueError("must be a domain-prefixed path, e.g. example.com/dispatcher "
                             "(Kueue's rule for multiKueue.dispatcherName)")
        return value

    @field_validator("origin")
    @classmethod
    def _label_value(cls, value: str | None) -> str | None:
        if value is not None and not _LABEL_VALUE.match(value):
            raise ValueError("must be a valid label value (alphanumerics, '-', '_', '.')")
        return value


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything


def _describe(err: ValidationError, flags: dict[str, str]) -> str:
    """Each problem named as the user gave it: the flag where a flag set the key, the
    config key otherwise."""
    problems = []
    for item in err.errors():
        key = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        for field, flag in flags.items():  # a rule across keys names them in its message
            message = re.sub(rf"\b{field}\b", flag, message)
        where = f"{flags[key]}" if key in flags else (f"config key '{key}'" if key else "")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def load_config(path: Path | str | None = None,
                overrides: dict[str, Any] | None = None,
                flag_names: dict[str, str] | None = None) -> DispatcherConfig:
    """The configuration from ``path`` (YAML; keys as in the model, dashes or underscores),
    with ``overrides`` (flags that were given) on top. ``flag_names`` maps a key to the
    flag that sets it, so a refusal of a value given as a flag names the flag."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = read_yaml_mapping(Path(path))
        except YamlFileError as err:
            raise ConfigError(f"config file {path}: {err}") from None
        data = {str(k).replace("-", "_"): v for k, v in loaded.items()}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    data.update(given)
    try:
        return DispatcherConfig.model_validate(data)
    except ValidationError as err:
        # Without a file, a key nobody gave is named by the flag that would give it too.
        flags = {k: f for k, f in (flag_names or {}).items()
                 if k in given or (path is None and k not in data)}
        raise ConfigError(_describe(err, flags)) from None
