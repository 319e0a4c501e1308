"""Who a request is from, as the aggregation layer tells it: the request comes over TLS
with the front proxy's client certificate (signed by the ``requestheader-client-ca-file``
of the ``kube-system/extension-apiserver-authentication`` ConfigMap, with a common name
among its ``requestheader-allowed-names``), and the user is in the headers that ConfigMap
names (``requestheader-username-headers``, ``-group-headers``, ``-extra-headers-prefix``).
Headers from any other caller are never believed. The ConfigMap is read again every
``RELOAD_SECONDS``, so a rotated front-proxy CA is taken up without a restart."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from kubernetes import client

from controller_kit.kubeclient import describe_error

log = logging.getLogger(__name__)

CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
RELOAD_SECONDS = 30.0
CA_KEY = "requestheader-client-ca-file"


@dataclass(frozen=True)
class RequestHeaderConfig:
    """The aggregation layer's settings from the ConfigMap; ``problem`` says why there are
    none ("" when there are)."""

    client_ca: str = ""
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()
    problem: str = ""

    @classmethod
    def from_configmap(cls, data: Mapping[str, str] | None) -> RequestHeaderConfig:
        data = data or {}
        where = f"ConfigMap {'/'.join(CONFIGMAP)}"
        if not data.get(CA_KEY):
            return cls(problem=f"{where} has no {CA_KEY}: the manager's apiserver runs "
                               "without the aggregation layer's front proxy "
                               "(--requestheader-client-ca-file)")

        def names(key: str) -> tuple[str, ...]:
            try:
                value = json.loads(data.get(key) or "[]")
            except ValueError:
                return ()
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        return cls(client_ca=data[CA_KEY], allowed_names=names("requestheader-allowed-names"),
                   username_headers=names("requestheader-username-headers"),
                   group_headers=names("requestheader-group-headers"),
                   extra_prefixes=names("requestheader-extra-headers-prefix"))


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


class Unauthenticated(Exception):
    """Not from the aggregation layer (401); the message says what is missing."""


def _common_name(peer: Mapping | None) -> str | None:
    for rdn in (peer or {}).get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


def authenticate(config: RequestHeaderConfig, peer: Mapping | None,
                 headers) -> User:
    """The user of a request whose TLS peer certificate (as ``SSLSocket.getpeercert()``
    gives it: verified against the front proxy's CA, or none) and ``headers`` (an
    ``email.message.Message``: repeated headers kept) are these; Unauthenticated when it
    is not the front proxy's."""
    if config.problem:
        raise Unauthenticated(config.problem)
    if not peer:
        raise Unauthenticated("no client certificate: this API is served to the Kubernetes "
                              "aggregation layer only (the front proxy's certificate); ask "
                              "the manager's apiserver, e.g. kubectl get trainjobpods")
    name = _common_name(peer)
    if config.allowed_names and name not in config.allowed_names:
        raise Unauthenticated(f"client certificate CN {name!r} is not among "
                              f"requestheader-allowed-names {list(config.allowed_names)}")
    user = next((value.strip() for header in config.username_headers
                 for value in headers.get_all(header) or () if value.strip()), "")
    if not user:
        raise Unauthenticated(f"no user in the {', '.join(config.username_headers) or 'user'}"
                              " header from the front proxy")
    groups = tuple(value.strip() for header in config.group_headers
                   for value in headers.get_all(header) or () if value.strip())
    extra: dict[str, list[str]] = {}
    for header, value in headers.items():
        for prefix in config.extra_prefixes:
            if header.lower().startswith(prefix.lower()):
                key = unquote(header[len(prefix):]).lower()
                extra.setdefault(key, []).append(value)
    return User(user, groups, extra)


class FrontProxySettings:
    """The ConfigMap's settings, kept up to date by a thread of its own; ``current()`` is
    the latest read (a failed read keeps the previous one, or says why there is none)."""

    def __init__(self, api: client.ApiClient, reload_seconds: float = RELOAD_SECONDS):
        self._core = client.CoreV1Api(api)
        self._reload = reload_seconds
        self._current = RequestHeaderConfig(problem=f"ConfigMap {'/'.join(CONFIGMAP)} "
                                                    "not read yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = ""

    def current(self) -> RequestHeaderConfig:
        return self._current

    def load(self) -> RequestHeaderConfig:
        try:
            data = self._core.read_namespaced_config_map(CONFIGMAP[1], CONFIGMAP[0]).data
            config = RequestHeaderConfig.from_configmap(data)
        except Exception as err:  # noqa: BLE001 - a failed read keeps what was read before
            problem = (f"cannot read ConfigMap {'/'.join(CONFIGMAP)}: {describe_error(err)} "
                       "(the dispatcher needs the extension-apiserver-authentication-reader "
                       "Role in kube-system: manifests/remote-api)")
            if self._current.problem:
                self._current = RequestHeaderConfig(problem=problem)
            self._say(problem)
            return self._current
        if config.problem:
            self._say(config.problem)
        self._current = config
        return config

    def _say(self, problem: str) -> None:
        if problem != self._said:
            self._said = problem
            log.warning("remote view: %s", problem)

    def start(self) -> FrontProxySettings:
        self.load()
        self._thread = threading.Thread(target=self._run, name="remote-view-front-proxy",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._reload):
            self.load()

    def stop(self) -> None:
        self._stop.set()
