"""Kubernetes API clients built from a kubeconfig (file or dict) or the in-cluster service
account, optionally rate limited per cluster, and a server-side-apply helper."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainjob.yaml_errors import YamlFileError, read_yaml_mapping

# Threads share one client per cluster; urllib3's default pool (5 x CPUs) would make
# them queue for connections.
POOL_SIZE = 32


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved up. ``acquire`` blocks until a token
    is free, so every request to one cluster shares one budget."""

    def __init__(self, qps: float, burst: int):
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take a token; returns how long the caller waited."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait:
            time.sleep(wait)  # the reservation is already made; waiting is the rate limit
        return wait


RequestObserver = Callable[[str, str], None]

# Without a timeout, a request to an apiserver that accepted the connection but stopped
# answering (a frozen process, a half-open connection) blocks its thread forever. Watches
# pass their own timeout.
DEFAULT_REQUEST_TIMEOUT = 30.0


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request (watches included, once per start) first takes a
    token from the cluster's bucket, and is reported to ``observer(verb, code)`` (code
    "error" when no HTTP answer came back)."""

    def __init__(self, configuration: client.Configuration, limiter: TokenBucket | None,
                 observer: RequestObserver | None = None,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT):
        super().__init__(configuration)
        self.limiter = limiter
        self.observer = observer
        # (connect, read): connecting to a live apiserver on any network takes far less.
        self.request_timeout = ((min(5.0, request_timeout), request_timeout)
                                if request_timeout else None)

    def call_api(self, method, *args, **kwargs):
        if self.limiter is not None:
            self.limiter.acquire()
        if kwargs.get("_request_timeout") is None and self.request_timeout is not None:
            kwargs["_request_timeout"] = self.request_timeout
        code = "error"
        try:
            response = super().call_api(method, *args, **kwargs)
            code = str(getattr(response, "status", "error"))
            return response
        finally:
            if self.observer is not None:
                self.observer(method, code)


def api_client(kubeconfig: str | Path | dict | None = None, context: str | None = None,
               *, qps: float | None = None, burst: int | None = None,
               observer: RequestObserver | None = None,
               request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
               user_agent: str | None = None) -> client.ApiClient:
    """An ``ApiClient`` for ``kubeconfig`` (a path or an already parsed dict; in-cluster
    configuration when None), rate limited when ``qps`` is given; requests that do not set
    their own timeout give up after ``request_timeout`` seconds. ``user_agent`` names the
    program in every request (apiserver audit logs tell writers apart by it)."""
    configuration = client.Configuration()
    if kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)
    elif isinstance(kubeconfig, dict):
        config.load_kube_config_from_dict(kubeconfig, context=context,
                                          client_configuration=configuration,
                                          persist_config=False)
    else:
        _load_kubeconfig_file(Path(kubeconfig), context, configuration)
    configuration.connection_pool_maxsize = POOL_SIZE
    limiter = TokenBucket(qps, burst or max(1, int(qps))) if qps else None
    api = RateLimitedApiClient(configuration, limiter, observer, request_timeout)
    if user_agent:
        api.user_agent = user_agent
    return api


class KubeconfigError(ValueError):
    """A kubeconfig file that cannot be used; the message names the file and what is wrong
    with it, never its content."""


def _load_kubeconfig_file(path: Path, context: str | None,
                          configuration: client.Configuration) -> None:
    # The client's own messages name neither the file nor the problem ("Invalid kube-config
    # file. No configuration found.", "'str' object does not support item assignment").
    try:
        loaded = read_yaml_mapping(path)
    except YamlFileError as err:
        raise KubeconfigError(f"{path}: {err}") from None
    if not loaded.get("clusters") or not loaded.get("contexts"):
        raise KubeconfigError(f"{path}: not a kubeconfig (it lists no clusters or contexts)")
    try:
        config.load_kube_config(config_file=str(path), context=context,
                                client_configuration=configuration, persist_config=False)
    except Exception as err:  # noqa: BLE001 - say which file, whatever the client says
        raise KubeconfigError(f"{path}: {' '.join(str(err).split())}") from None


APPLY_PATCH = "application/apply-patch+yaml"


def apply_body(body: dict) -> bytes:
    """``body`` as an apply patch: JSON (a YAML document) in UTF-8 with every character
    written as itself. The apiserver decodes apply patches as YAML, whose decoder refuses the
    surrogate-pair escapes ``json.dumps`` writes by default for characters beyond the Basic
    Multilingual Plane (an emoji in a script or a command)."""
    return json.dumps(body, ensure_ascii=False).encode()


def apply_custom_object(api: client.ApiClient, group: str, version: str, plural: str,
                        body: dict, field_manager: str, *, force: bool = True) -> dict:
    """Server-side apply of a custom object (namespaced when ``body`` names a namespace);
    returns the object as the server stored it."""
    meta = body["metadata"]
    where = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    # A raw request: the generated client accepts only a dict body, which it would encode
    # with the escapes ``apply_body`` avoids.
    params = api.param_serialize(
        method="PATCH", resource_path=f"/apis/{group}/{version}{where}/{plural}/{meta['name']}",
        query_params=[("fieldManager", field_manager), ("force", str(force).lower())],
        header_params={"Content-Type": APPLY_PATCH, "Accept": "application/json"},
        body=apply_body(body), auth_settings=["BearerToken"])
    response = api.call_api(*params)
    data = response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    return json.loads(data)


def namespace_terminating(err: ApiException) -> bool:
    """The apiserver refused a create because the namespace is being deleted: nothing is
    wrong with the object, and the namespace will soon be gone."""
    return err.status == 403 and "NamespaceTerminating" in (err.body or "")


def refusal_summary(err: ApiException) -> str:
    """``field: reason`` for each cause of a refusal, without the rejected value, which
    for a JobSet can be its whole spec."""
    try:
        causes = (json.loads(err.body).get("details") or {}).get("causes") or []
    except (TypeError, ValueError, AttributeError):
        causes = []
    parts = [f"{cause.get('field') or 'object'}: {(cause.get('message') or '').rsplit(': ', 1)[-1]}"
             for cause in causes if cause.get("field") != "<nil>"]
    return "; ".join(parts) or error_message(err)


def error_message(err: ApiException) -> str:
    """The apiserver's own explanation from an error response."""
    try:
        return json.loads(err.body).get("message") or str(err.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{err.status} {err.reason}"


def describe_error(err: BaseException) -> str:
    """Any error as one line for a log, Event or condition. An ApiException's ``str()``
    spans lines and carries the HTTP response headers; this keeps its status code, the
    Status reason and the apiserver's message."""
    if isinstance(err, ApiException):
        reason = err.reason
        try:
            reason = json.loads(err.body).get("reason") or reason
        except (TypeError, ValueError, AttributeError):
            pass
        line = f"HTTP {err.status} {reason}"
        message = error_message(err) if err.body else ""
        if message and message != reason:
            line += f": {message}"
    else:
        line = f"{type(err).__name__}: {err}"
    return " ".join(line.split())
