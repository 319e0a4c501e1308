"""Which workers the manager's objects describe, and each one's kubeconfig.

Workers come from MultiKueueCluster objects on the manager (kubeconfig in a Secret under
key ``kubeconfig``, in the dispatcher's own namespace; or a file a ``Path`` location names
inside ``--kubeconfig-dir``), narrowed and ordered by the configured MultiKueueConfig, and
from the configuration file's static list. In kueue mode the Secret is the dispatcher's
own, of the name the MultiKueueCluster gives: Kueue's Secret of that name, in Kueue's
namespace, holds Kueue's identity on the worker, which may create jobs there; the
dispatcher only reads a worker. Only the Secrets the registrations name are read, each by
name (``named_secrets``): the namespace's other Secrets are none of the dispatcher's
business.

A registration problem (a MultiKueueConfig that names a missing cluster, a static worker
named like a MultiKueueCluster) is said once when it appears: a log line and, once this
replica may write, an Event on the object concerned.
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from controller_kit.events import EventRecorder
from controller_kit.informer import Informer
from dispatcher.config import DispatcherConfig
from dispatcher.workers.cluster import REASON_PENDING, REASON_UNSUPPORTED_SOURCE
from dispatcher.workers.kubeconfig_policy import BAD_KUBECONFIG
from dispatcher.workers.named_secrets import NamedSecrets
from trainjob import constants as c

log = logging.getLogger(__name__)

KUBECONFIG_KEY = "kubeconfig"


@dataclass
class Registration:
    """One worker the manager's objects (or the static list) describe."""

    name: str
    order: int
    kubeconfig: str | None  # None when it cannot be had: reason and message say why
    reason: str = ""
    message: str = ""
    from_object: bool = True
    created: str = ""


class Registrations:
    """The MultiKueueClusters, MultiKueueConfigs and named Secrets on the manager, cached;
    ``on_change`` is called whenever one of them changes."""

    def __init__(self, manager: client.ApiClient, config: DispatcherConfig,
                 on_change: Callable[[], None], recorder: EventRecorder | None = None,
                 may_write: Callable[[], bool] = lambda: True):
        self.config = config
        self.recorder = recorder
        self.may_write = may_write
        custom = client.CustomObjectsApi(manager)
        self.clusters = Informer("multikueueclusters", functools.partial(
            custom.list_cluster_custom_object, c.KUEUE_GROUP, c.KUEUE_VERSION,
            c.MULTIKUEUECLUSTERS))
        self.configs = Informer("multikueueconfigs", functools.partial(
            custom.list_cluster_custom_object, c.KUEUE_GROUP, c.KUEUE_VERSION,
            c.MULTIKUEUECONFIGS))
        self.secrets = NamedSecrets(manager, config.worker_secrets_namespace, on_change)
        # The Secrets the last derivation named: the others' caches are stopped (``retain``).
        self._named: set[str] = set()
        # Registration problems already logged, and already told in an Event.
        self._logged: set[str] = set()
        self._evented: set[str] = set()
        for informer in (self.clusters, self.configs):
            informer.add_handler(lambda *_: on_change())

    def start(self, sync_timeout: float) -> None:
        """Start the MultiKueueCluster and MultiKueueConfig caches and wait for them."""
        for informer in (self.clusters, self.configs):
            informer.start()
        for informer in (self.clusters, self.configs):
            if not informer.wait_synced(sync_timeout):
                raise TimeoutError(f"manager {informer.name} cache not synced")

    def threads(self) -> list[threading.Thread | None]:
        """The threads of its caches (the named Secrets' included)."""
        return [self.clusters.thread, self.configs.thread] + self.secrets.threads()

    def stop(self) -> None:
        for informer in (self.clusters, self.configs):
            informer.stop(timeout=1)
        self.secrets.stop()

    def cluster(self, name: str) -> dict | None:
        """The MultiKueueCluster of that name, from the cache."""
        return self.clusters.get("", name)

    def retain(self) -> None:
        """Stop the caches of the Secrets no registration named in the last derivation
        (``desired``, and ``of`` since)."""
        self.secrets.retain(self._named)

    def desired(self, report: bool = True) -> list[Registration]:
        """Every worker the manager's objects and the static list describe, in order."""
        self._named = set()
        problems: dict[str, tuple[dict | None, str, str]] = {}
        mk_config = None
        if self.config.multikueue_config:
            mk_config = self.configs.get("", self.config.multikueue_config)
            names = list(((mk_config or {}).get("spec") or {}).get("clusters") or [])
            if mk_config is None:
                problems["config"] = (None, "NotFound", (
                    f"MultiKueueConfig {self.config.multikueue_config} not found: no worker "
                    "from MultiKueueClusters"))
        else:
            names = sorted(name for _, name in self.clusters.keys())
        desired = []
        for order, name in enumerate(names):
            obj = self.clusters.get("", name)
            if obj is None:
                problems[f"missing/{name}"] = (mk_config, "ClusterNotFound", (
                    f"MultiKueueConfig {self.config.multikueue_config} lists {name}, but no "
                    "MultiKueueCluster has that name: it is not used"))
                continue
            desired.append(self.of(obj, order))
        for offset, static in enumerate(self.config.workers):
            if static.name in names:
                # The API object is what users see and change: it wins, visibly.
                problems[f"clash/{static.name}"] = (self.clusters.get("", static.name),
                                                    "NameClash", (
                    f"the configuration file's workers[{offset}] is named {static.name}, like "
                    f"MultiKueueCluster {static.name}: only the MultiKueueCluster is used; "
                    "rename the static worker"))
                continue
            try:
                desired.append(Registration(static.name, len(names) + offset,
                                            Path(static.kubeconfig).read_text(),
                                            from_object=False))
            except OSError as err:
                desired.append(Registration(
                    static.name, len(names) + offset, None, BAD_KUBECONFIG,
                    f"cannot read {static.kubeconfig}: {err.strerror}", from_object=False))
        if report:
            self._report(problems)
        return desired

    def _report(self, problems: dict[str, tuple[dict | None, str, str]]) -> None:
        """Say each registration problem once when it appears: a log line, and (once this
        replica may write) an Event on the object concerned; not at every re-derivation."""
        for key in problems.keys() - self._logged:
            log.warning("%s", problems[key][2])
        self._logged = set(problems)
        if self.recorder is None or not self.may_write():
            return
        for key in problems.keys() - self._evented:
            obj, reason, message = problems[key]
            if obj is not None:
                self.recorder.event(obj, "Warning", reason, message)
        self._evented = set(problems)

    def of(self, obj: dict, order: int) -> Registration:
        """The registration a MultiKueueCluster describes, at position ``order``."""
        text, reason, message = self._kubeconfig_of(obj)
        return Registration(obj["metadata"]["name"], order, text, reason, message,
                            created=obj["metadata"].get("creationTimestamp") or "")

    def _kubeconfig_of(self, obj: dict) -> tuple[str | None, str, str]:
        cluster_source = (obj.get("spec") or {}).get("clusterSource") or {}
        if "clusterProfileRef" in cluster_source and "kubeConfig" not in cluster_source:
            # Kueue's schema allows it (behind its MultiKueueClusterProfile gate); reaching a
            # worker through a ClusterProfile needs its credential plugins, not read here.
            return None, REASON_UNSUPPORTED_SOURCE, (
                "spec.clusterSource.clusterProfileRef "
                f"{(cluster_source['clusterProfileRef'] or {}).get('name', '')}: ClusterProfile "
                "references are not supported by this dispatcher; give the worker's "
                "kubeconfig in spec.clusterSource.kubeConfig")
        source = cluster_source.get("kubeConfig") or {}
        location = source.get("location", "")
        if source.get("locationType", "Secret") == "Path":
            if refusal := self._path_refusal(location):
                return None, BAD_KUBECONFIG, refusal
            try:
                return Path(location).read_text(), "", ""
            except OSError as err:
                return (None, BAD_KUBECONFIG,
                        f"cannot read kubeconfig file {location}: {err.strerror}")
        self._named.add(location)
        secret, unknown = self.secrets.state(location)
        if unknown:
            return None, REASON_PENDING if self.secrets.pending(location) else BAD_KUBECONFIG, \
                unknown
        where = f"Secret {self.config.worker_secrets_namespace}/{location}"
        if secret is None:
            return None, BAD_KUBECONFIG, f"{where} not found"
        data = (secret.get("data") or {}).get(KUBECONFIG_KEY)
        if not data:
            return None, BAD_KUBECONFIG, f"{where} has no key {KUBECONFIG_KEY!r}"
        try:
            return base64.b64decode(data).decode(), "", ""
        except (ValueError, UnicodeDecodeError):
            return None, BAD_KUBECONFIG, f"{where} key {KUBECONFIG_KEY!r} is not text"

    def _path_refusal(self, location: str) -> str | None:
        """Why a Path location may not be read: only files inside the configured
        directories are (links resolved first, so none leads out)."""
        allowed = [Path(d).resolve() for d in self.config.kubeconfig_dirs]
        if not allowed:
            return (f"spec.clusterSource.kubeConfig.location {location}: Path locations are "
                    "refused (no --kubeconfig-dir is configured)")
        resolved = Path(location).resolve()
        if not any(resolved.is_relative_to(d) for d in allowed):
            return (f"spec.clusterSource.kubeConfig.location {location}: outside the "
                    f"directories Path locations may name ({', '.join(map(str, allowed))})")
        return None
