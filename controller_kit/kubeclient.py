"""Kubernetes API clients built from a kubeconfig (file or dict) or the in-cluster service
account, optionally rate limited per cluster, and a server-side-apply helper.

The commands find their cluster as kubectl does (``find_kubeconfig``): ``--kubeconfig``;
else ``$KUBECONFIG``, a list of files merged (the first file to name a cluster, user or
context, or to set current-context, wins; files that do not exist are skipped); else
``~/.kube/config``; else, in a Pod, its service account. As with kubectl, a set
``$KUBECONFIG`` replaces ``~/.kube/config`` rather than going before it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.incluster_config import InClusterConfigLoader

from controller_kit.controller_metrics import ApiRequest
from controller_kit.lean_http import LeanFailed, LeanWrites
from controller_kit.writes import object_path, request_json
from controller_kit.yaml_errors import YamlFileError, read_yaml_mapping

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


# Told of every request a client makes (``controller_kit.controller_metrics.ApiRequest``).
RequestObserver = Callable[[ApiRequest], None]

# Without a timeout, a request to an apiserver that accepted the connection but stopped
# answering (a frozen process, a half-open connection) blocks its thread forever. Watches
# pass their own timeout.
DEFAULT_REQUEST_TIMEOUT = 30.0


# How often a bearer token's source is looked at again (its expiry, the service account's
# token file): the client library's hook does it before every request, and each time also
# sets the configuration's host again, which reads every environment variable for a proxy.
TOKEN_CHECK_SECONDS = 1.0


class ThrottledTokenHook:
    """The client library's ``refresh_api_key_hook``, run at most once per ``interval``
    seconds. The hook re-installs itself when it runs, so this puts itself back after it."""

    def __init__(self, hook: Callable[[client.Configuration], None],
                 interval: float = TOKEN_CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self._hook = hook
        self._interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: client.Configuration) -> None:
        with self._lock:
            now = self._clock()
            if now < self._next:
                return
            self._next = now + self._interval
            self._hook(configuration)
            installed = configuration.refresh_api_key_hook
            if installed is not self:
                if installed is not None:
                    self._hook = installed
                configuration.refresh_api_key_hook = self


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request (watches included, once per start) first takes a
    token from the cluster's bucket, and is reported to ``observer`` (verb, apiserver,
    HTTP status or none, latency and time spent waiting for a token). Writes with a JSON
    body go over kept-alive connections of their own (``lean_http``)."""

    def __init__(self, configuration: client.Configuration, limiter: TokenBucket | None,
                 observer: RequestObserver | None = None,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT):
        super().__init__(configuration)
        self.limiter = limiter
        self.observer = observer
        # (connect, read): connecting to a live apiserver on any network takes far less.
        self.request_timeout = ((min(5.0, request_timeout), request_timeout)
                                if request_timeout else None)
        self.lean = LeanWrites(configuration) if LeanWrites.usable(configuration) else None

    def call_api(self, method, url, *args, **kwargs):
        waited = self.limiter.acquire() if self.limiter is not None else None
        if kwargs.get("_request_timeout") is None and self.request_timeout is not None:
            kwargs["_request_timeout"] = self.request_timeout
        status = None
        started = time.monotonic()
        try:
            response = self._lean_call(method, url, *args, **kwargs)
            if response is None:
                response = super().call_api(method, url, *args, **kwargs)
            status = getattr(response, "status", None)
            return response
        except ApiException as err:
            status = err.status or None  # an answer (e.g. 429 after retries), or none (0)
            raise
        finally:
            if self.observer is not None:
                self.observer(ApiRequest(method, urlsplit(url).netloc, status,
                                         time.monotonic() - started, waited))

    def _lean_call(self, method, url, header_params=None, body=None, post_params=None,
                   _request_timeout=None):
        """The write sent over this thread's kept-alive connection, or None when it is not
        one such write or no answer came (the pool then sends it)."""
        if self.lean is None or post_params or not self.lean.takes(method, header_params, body):
            return None
        try:
            return self.lean.send(method, url, header_params, body, _request_timeout)
        except LeanFailed:
            return None


def api_client(kubeconfig: str | Path | dict | KubeconfigSource | None = None,
               context: str | None = None,
               *, qps: float | None = None, burst: int | None = None,
               observer: RequestObserver | None = None,
               request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
               user_agent: str | None = None,
               pool_size: int = POOL_SIZE) -> client.ApiClient:
    """An ``ApiClient`` for ``kubeconfig`` (a path, an already parsed dict, or what
    ``find_kubeconfig`` found; in-cluster configuration when None) and ``context`` (its
    current-context when None), rate limited when ``qps`` is given; requests that do not
    set their own timeout give up after ``request_timeout`` seconds. ``user_agent`` names
    the program in every request (apiserver audit logs tell writers apart by it).
    ``pool_size``: the connections kept open to the server (each watch holds one while
    open; one more than that is opened and closed again for each request)."""
    configuration = client.Configuration()
    if kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)
    elif isinstance(kubeconfig, KubeconfigSource):
        _load_source(kubeconfig, context, configuration)
    elif isinstance(kubeconfig, dict):
        config.load_kube_config_from_dict(kubeconfig, context=context,
                                          client_configuration=configuration,
                                          persist_config=False)
    else:
        _load_kubeconfig_file(Path(kubeconfig), context, configuration)
    configuration.connection_pool_maxsize = pool_size
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = ThrottledTokenHook(
            configuration.refresh_api_key_hook)
    limiter = TokenBucket(qps, burst or max(1, int(qps))) if qps else None
    api = RateLimitedApiClient(configuration, limiter, observer, request_timeout)
    if user_agent:
        api.user_agent = user_agent
    return api


class KubeconfigError(ValueError):
    """A kubeconfig file that cannot be used; the message names the file and what is wrong
    with it, never its content."""


def _load_kubeconfig_file(path: Path, context: str | None,
                          configuration: client.Configuration, named: str | None = None
                          ) -> None:
    # The client's own messages name neither the file nor the problem ("Invalid kube-config
    # file. No configuration found.", "'str' object does not support item assignment").
    named = named or str(path)
    try:
        loaded = read_yaml_mapping(path)
    except YamlFileError as err:
        raise KubeconfigError(f"{named}: {err}") from None
    if not loaded.get("clusters") or not loaded.get("contexts"):
        raise KubeconfigError(f"{named}: not a kubeconfig (it lists no clusters or contexts)")
    _check_context(loaded, context, named)
    try:
        config.load_kube_config(config_file=str(path), context=context,
                                client_configuration=configuration, persist_config=False)
    except Exception as err:  # noqa: BLE001 - say which file, whatever the client says
        raise KubeconfigError(f"{named}: {' '.join(str(err).split())}") from None


# --- finding the kubeconfig as kubectl does ----------------------------------------------

FROM_FLAG = "--kubeconfig"
FROM_ENVIRONMENT = "$KUBECONFIG"
FROM_HOME = "~/.kube/config"
IN_CLUSTER = "in-cluster"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_SERVICE_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
# Fields holding file names, which kubectl reads relative to the kubeconfig that has them.
_FILE_FIELDS = {"clusters": ("cluster", ("certificate-authority",)),
                "users": ("user", ("client-certificate", "client-key", "tokenFile")),
                "contexts": ("context", ())}


@dataclass(frozen=True)
class KubeconfigSource:
    """Where a command's cluster comes from (``find_kubeconfig``): kubeconfig ``files``,
    merged in order, or, with none, the Pod's service account (``service_account`` holds
    its token and CA; ``environment`` the apiserver's address from the Pod's variables)."""

    found_by: str
    files: tuple[Path, ...] = ()
    service_account: Path = SERVICE_ACCOUNT_DIR
    environment: Mapping[str, str] = field(default_factory=dict)

    def name(self, path: Path | None = None) -> str:
        """How messages name the source, or one of its files."""
        if self.found_by == FROM_FLAG:
            return f"--kubeconfig {path or self.files[0]}"
        if self.found_by == FROM_ENVIRONMENT:
            if path is None and len(self.files) == 1:
                path = self.files[0]
            return (f"$KUBECONFIG file {path}" if path else
                    f"$KUBECONFIG files {', '.join(str(f) for f in self.files)}")
        if self.found_by == FROM_HOME:
            return f"kubeconfig {path or self.files[0]} ({FROM_HOME})"
        return f"the in-cluster service account ({self.service_account})"


def find_kubeconfig(flag: str | Path | None, environ: Mapping[str, str] | None = None,
                    home: Path | None = None,
                    service_account: Path = SERVICE_ACCOUNT_DIR) -> KubeconfigSource:
    """The kubeconfig a command uses, found as kubectl finds it: ``flag``
    (``--kubeconfig``); else the files ``$KUBECONFIG`` lists that exist; else
    ``~/.kube/config``; else the Pod's service account. Raises ``KubeconfigError`` naming
    everything it looked for when there is none."""
    environ = os.environ if environ is None else environ
    if flag:
        return KubeconfigSource(FROM_FLAG, (Path(flag).expanduser(),))
    listed = list(dict.fromkeys(p for p in environ.get("KUBECONFIG", "").split(os.pathsep)
                                if p))
    if listed:
        existing = tuple(Path(p).expanduser() for p in listed if Path(p).expanduser().is_file())
        if existing:
            return KubeconfigSource(FROM_ENVIRONMENT, existing)
        looked = (f"$KUBECONFIG lists {', '.join(listed)}, and "
                  f"{'none of them exists' if len(listed) > 1 else 'it does not exist'} "
                  f"(with $KUBECONFIG set, {FROM_HOME} is not read, as with kubectl)")
    else:
        home = home or (Path(environ["HOME"]) if environ.get("HOME") else Path.home())
        default = home / ".kube" / "config"
        if default.is_file():
            return KubeconfigSource(FROM_HOME, (default,))
        looked = f"no --kubeconfig, $KUBECONFIG is not set and {default} does not exist"
    token = service_account / "token"
    if all(environ.get(name) for name in _SERVICE_ENV) and token.is_file():
        return KubeconfigSource(IN_CLUSTER, service_account=service_account,
                                environment={name: environ[name] for name in _SERVICE_ENV})
    pod = ("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
           if not all(environ.get(name) for name in _SERVICE_ENV) else f"{token} does not exist")
    raise KubeconfigError(f"no Kubernetes configuration found: {looked}; and this is not a "
                          f"Pod with a service account ({pod}). Give --kubeconfig FILE")


def merge_kubeconfigs(source: KubeconfigSource) -> dict:
    """``source``'s files merged as kubectl merges them: the first file to name a cluster,
    user or context, or to set current-context, wins; file names inside each file are
    made absolute from that file's directory, as kubectl reads them."""
    merged: dict = {"apiVersion": "v1", "kind": "Config",
                    "clusters": [], "contexts": [], "users": []}
    for path in source.files:
        try:
            loaded = read_yaml_mapping(path)
        except YamlFileError as err:
            raise KubeconfigError(f"{source.name(path)}: {err}") from None
        for section, (key, file_fields) in _FILE_FIELDS.items():
            items = loaded.get(section) or []
            if not isinstance(items, list):
                raise KubeconfigError(f"{source.name(path)}: {section} must be a list")
            known = {item["name"] for item in merged[section]}
            for item in items:
                if not isinstance(item, dict) or not item.get("name"):
                    raise KubeconfigError(f"{source.name(path)}: an entry of {section} has "
                                          "no name")
                if item["name"] in known:
                    continue
                known.add(item["name"])
                merged[section].append(_absolute_files(item, key, file_fields, path.parent))
        if "current-context" not in merged and loaded.get("current-context"):
            merged["current-context"] = loaded["current-context"]
    if not merged["clusters"] or not merged["contexts"]:
        raise KubeconfigError(f"{source.name()}: not a kubeconfig (the files list no clusters "
                              "or contexts)")
    return merged


def _absolute_files(item: dict, key: str, file_fields: tuple[str, ...], base: Path) -> dict:
    inner = item.get(key)
    if not isinstance(inner, dict):
        return item
    inner = {**inner, **{name: str(base / inner[name]) for name in file_fields
                         if isinstance(inner.get(name), str) and inner[name]
                         and not os.path.isabs(inner[name])}}
    return {**item, key: inner}


def _check_context(loaded: dict, context: str | None, named: str) -> None:
    """A chosen context that is missing, or none chosen, said plainly (the client says
    "Expected key current-context in kube-config")."""
    names = [c.get("name") for c in loaded.get("contexts") or [] if isinstance(c, dict)]
    listed = ", ".join(str(n) for n in names)
    if context is not None:
        if context not in names:
            raise KubeconfigError(f"{named}: it has no context {context!r} (--context); its "
                                  f"contexts: {listed}")
        return
    current = loaded.get("current-context")
    if not current:
        raise KubeconfigError(f"{named}: it sets no current-context; choose one of its "
                              f"contexts with --context: {listed}")
    if current not in names:
        raise KubeconfigError(f"{named}: its current-context {current!r} is not one of its "
                              f"contexts ({listed}); choose one with --context")


def _load_source(source: KubeconfigSource, context: str | None,
                 configuration: client.Configuration) -> None:
    if not source.files:
        if context is not None:
            raise KubeconfigError(f"--context {context}: there is no kubeconfig to choose it "
                                  f"from (none was found, so {source.name()} is used)")
        try:
            InClusterConfigLoader(token_filename=str(source.service_account / "token"),
                                  cert_filename=str(source.service_account / "ca.crt"),
                                  environ=dict(source.environment)
                                  ).load_and_set(configuration)
        except Exception as err:  # noqa: BLE001 - say where, whatever the client says
            raise KubeconfigError(f"{source.name()}: {' '.join(str(err).split())}") from None
        return
    if len(source.files) == 1:
        _load_kubeconfig_file(source.files[0], context, configuration, source.name())
        return
    merged = merge_kubeconfigs(source)
    _check_context(merged, context, source.name())
    try:
        config.load_kube_config_from_dict(merged, context=context,
                                          client_configuration=configuration,
                                          persist_config=False)
    except Exception as err:  # noqa: BLE001 - say which files, whatever the client says
        raise KubeconfigError(f"{source.name()}: {' '.join(str(err).split())}") from None


APPLY_PATCH = "application/apply-patch+yaml"


def apply_body(body: dict) -> bytes:
    """``body`` as an apply patch: JSON (a YAML document) in UTF-8 with every character
    written as itself (``orjson`` writes no escapes). The apiserver decodes apply patches
    as YAML, whose decoder refuses the surrogate-pair escapes of characters beyond the
    Basic Multilingual Plane (an emoji in a script or a command)."""
    return orjson.dumps(body)


def apply_custom_object(api: client.ApiClient, group: str, version: str, plural: str,
                        body: dict, field_manager: str, *, force: bool = True) -> dict:
    """Server-side apply of a custom object (namespaced when ``body`` names a namespace);
    returns the object as the server stored it."""
    meta = body["metadata"]
    # Raw: the generated client would encode a dict with the escapes ``apply_body`` avoids.
    return request_json(api, "PATCH", object_path(group, version, meta.get("namespace"),
                                                  plural, meta["name"]),
                        apply_body(body), content_type=APPLY_PATCH,
                        query=[("fieldManager", field_manager), ("force", str(force).lower())])


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


class ClusterUnusable(RuntimeError):
    """The cluster cannot serve the component as it is; the message says why and what to
    do."""


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
