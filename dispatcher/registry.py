"""The worker registry: which worker clusters exist, how to reach them, and whether they
answer.

Workers come from MultiKueueCluster objects on the manager (kubeconfig in a Secret under
key ``kubeconfig``, in the dispatcher's namespace or, in kueue mode, Kueue's; or a Path),
narrowed and ordered by the configured MultiKueueConfig, and from the configuration file's static list. The registry is
level-triggered: any change to those objects or Secrets re-derives the whole set, and a
worker whose kubeconfig did not change keeps its connection and caches. Only the Secrets
the registrations name are read, each by name (``named_secrets``): the namespace is shared
with Kueue, whose other Secrets are none of the dispatcher's business.

Connection state is probed every ``probe_interval`` seconds per worker, each worker on its
own thread, and reported as the ``Active`` condition on its MultiKueueCluster.

A worker has one identity: the UID of its ``kube-system`` namespace, which names the
apiserver's storage whatever URL or credentials reach it. Two registrations of one cluster
(say, a second Secret made from the same kubeconfig) would each treat the other's copies as
strays; only the oldest registration is used, the others are reported ``Active=False``
with reason ``DuplicateRegistration`` naming it.

A worker that leaves the registry (its MultiKueueCluster deleted, the MultiKueueConfig
narrowed) while manager jobs are placed on it is kept as a *draining* connection: never a
candidate for placement, but reachable, so the reconciler can delete those jobs' copies
there and confirm they are gone before placing them elsewhere. It is dropped once no job
is placed on it any more.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from kubernetes import client

from dispatcher.capacity import WorkerCapacity
from dispatcher.config import DispatcherConfig
from dispatcher.kubeconfig_policy import BAD_KUBECONFIG, check_kubeconfig
from dispatcher.named_secrets import NamedSecrets
from dispatcher.remote import SentDeletes
from dispatcher.worker_quota import WorkerQuota
from trainjob import constants as c
from trainjob import logs
from trainjob.conditions import format_time
from trainjob.events import EventRecorder
from trainjob.informer import Informer
from trainjob.kubeclient import api_client, describe_error

log = logging.getLogger(__name__)

ACTIVE = "Active"
REASON_ACTIVE = "Active"
REASON_CONNECTION_FAILED = "ClientConnectionFailed"
REASON_DUPLICATE = "DuplicateRegistration"
REASON_UNSUPPORTED_SOURCE = "UnsupportedClusterSource"
# The worker's Secret is being read for the first time: no verdict to publish yet (its first
# list, a moment away, re-derives the worker).
REASON_PENDING = "KubeconfigPending"
KUBECONFIG_KEY = "kubeconfig"
# Created by every apiserver at start and never deleted: its UID identifies the cluster.
IDENTITY_NAMESPACE = "kube-system"

WorkerEvent = Callable[[str, str, str, dict | None, dict | None], None]


@dataclass
class WorkerCluster:
    """One worker as the dispatcher sees it."""

    name: str
    order: int
    fingerprint: str
    api: client.ApiClient | None = None
    informers: dict[str, Informer] = field(default_factory=dict)
    capacity: WorkerCapacity = field(default_factory=WorkerCapacity)
    # Kueue mode: the worker Kueue's queues and quota (None in standalone mode).
    quota: WorkerQuota | None = None
    active: bool = False
    reason: str = REASON_CONNECTION_FAILED
    message: str = "not probed yet"
    since: float = field(default_factory=time.time)  # wall clock of the last state change
    from_object: bool = True  # a MultiKueueCluster (not the static list) describes it
    # When its MultiKueueCluster was created ("" for the static list): the oldest of two
    # registrations of one cluster is the one used.
    created: str = ""
    identity: str = ""  # the cluster's kube-system namespace UID, once its caches know it
    draining: bool = False  # left the registry; kept only to remove the copies placed there
    sent_deletes: SentDeletes = field(default_factory=SentDeletes)

    @property
    def precedence(self) -> tuple[str, int, str]:
        return (self.created or "~", self.order, self.name)

    @property
    def connected(self) -> bool:
        return self.api is not None

    def cache(self, resource: str) -> Informer:
        return self.informers[resource]

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop(timeout=1)
        if self.quota is not None:
            self.quota.stop()
        if self.api is not None:
            self.api.close()


@dataclass
class _Registration:
    """One worker the manager's objects (or the static list) describe."""

    name: str
    order: int
    kubeconfig: str | None  # None when it cannot be had: reason and message say why
    reason: str = ""
    message: str = ""
    from_object: bool = True
    created: str = ""


class WorkerRegistry:
    def __init__(self, manager: client.ApiClient, config: DispatcherConfig,
                 on_worker_event: WorkerEvent, on_state_change: Callable[[WorkerCluster], None],
                 probe_interval: float = 2.0, probe_timeout: float = 2.0,
                 may_write: Callable[[], bool] = lambda: True,
                 observer: Callable[[str], Callable[[str, str], None]] | None = None,
                 in_use: Callable[[], set[str]] = set,
                 recorder: EventRecorder | None = None,
                 publish_conditions: Callable[[], bool] = lambda: True):
        self.manager = manager
        self.config = config
        self.on_worker_event = on_worker_event
        self.on_state_change = on_state_change
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        # Only the leader writes conditions; a standby keeps the same picture silently.
        self.may_write = may_write
        # False while Kueue's MultiKueue controller owns the MultiKueueCluster conditions.
        self.publish_conditions = publish_conditions
        self._left_conditions = False
        self.observer = observer  # cluster name -> request observer for its client
        # Names of workers that manager jobs are placed on (and may have copies on).
        self.in_use = in_use
        self.recorder = recorder
        self.workers: dict[str, WorkerCluster] = {}
        # Last known identity per worker name, kept across reconnects: the garbage
        # collector asks whether two names are one cluster even while one is down.
        self.identities: dict[str, str] = {}
        # Registration problems already logged, and already told in an Event.
        self._logged: set[str] = set()
        self._evented: set[str] = set()
        self._lock = threading.RLock()
        # Condition writes one at a time, each by the worker object current at that moment:
        # two syncs can run back to back (a Secret's first list ends during one), and the
        # older one's write must not land after the newer one's.
        self._publish_lock = threading.Lock()
        custom = client.CustomObjectsApi(manager)
        self.clusters = Informer("multikueueclusters", functools.partial(
            custom.list_cluster_custom_object, c.KUEUE_GROUP, c.KUEUE_VERSION,
            c.MULTIKUEUECLUSTERS))
        self.configs = Informer("multikueueconfigs", functools.partial(
            custom.list_cluster_custom_object, c.KUEUE_GROUP, c.KUEUE_VERSION,
            c.MULTIKUEUECONFIGS))
        self.secrets = NamedSecrets(manager, config.worker_secrets_namespace, self.sync)
        # The Secrets the last re-derivation named: the others' caches are stopped.
        self._named: set[str] = set()
        for informer in (self.clusters, self.configs):
            informer.add_handler(lambda *_: self.sync())
        # Interval jobs only: UTC spares tzlocal guessing (and warning about) the zone.
        self._scheduler = BackgroundScheduler(daemon=True, timezone=datetime.timezone.utc)
        self._probes = ThreadPoolExecutor(max_workers=16, thread_name_prefix="probe")
        self._probing: set[str] = set()
        self._started = False

    # --- lifecycle ------------------------------------------------------------------

    def start(self, sync_timeout: float = 60) -> WorkerRegistry:
        deadline = time.monotonic() + sync_timeout
        for informer in (self.clusters, self.configs):
            informer.start()
        for informer in (self.clusters, self.configs):
            if not informer.wait_synced(sync_timeout):
                raise TimeoutError(f"manager {informer.name} cache not synced")
        # A first derivation starts the caches of the Secrets it names; the second, once
        # they are read, connects the workers (none is reported "not read yet" at start).
        with self._lock:
            self._desired(report=False)
        unread = self.secrets.wait_synced(max(deadline - time.monotonic(), 0))
        if unread:
            log.warning("Secrets not read at start (their workers wait for them): %s",
                        ", ".join(sorted(unread)))
        self._started = True
        self.sync()
        self._scheduler.add_job(self.probe_all, "interval", seconds=self.probe_interval,
                                id="probe-workers", max_instances=1, coalesce=True)
        self._scheduler.start()
        self.probe_all()
        return self

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._probes.shutdown(wait=False, cancel_futures=True)
        for informer in (self.clusters, self.configs):
            informer.stop(timeout=1)
        self.secrets.stop()
        with self._lock:
            for worker in self.workers.values():
                worker.stop()
            self.workers.clear()

    def snapshot(self, draining: bool = False) -> list[WorkerCluster]:
        """The registered workers in configuration order (with ``draining``, also those
        kept only to remove copies)."""
        with self._lock:
            return sorted((w for w in self.workers.values() if draining or not w.draining),
                          key=lambda w: w.order)

    def get(self, name: str) -> WorkerCluster | None:
        """A registered or draining worker."""
        with self._lock:
            return self.workers.get(name)

    def same_cluster(self, first: str, second: str) -> bool:
        """Whether two worker names reach one cluster (as far as is known)."""
        with self._lock:
            identity = self.identities.get(first)
            return first == second or (bool(identity) and identity == self.identities.get(second))

    # --- deriving the set of workers ---------------------------------------------------

    def _desired(self, report: bool = True) -> list[_Registration]:
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
            desired.append(self._registration(obj, order))
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
                desired.append(_Registration(static.name, len(names) + offset,
                                             Path(static.kubeconfig).read_text(),
                                             from_object=False))
            except OSError as err:
                desired.append(_Registration(
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

    def _registration(self, obj: dict, order: int) -> _Registration:
        text, reason, message = self._kubeconfig_of(obj)
        return _Registration(obj["metadata"]["name"], order, text, reason, message,
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
                return None, BAD_KUBECONFIG, f"cannot read kubeconfig file {location}: {err.strerror}"
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

    def sync(self) -> None:
        """Re-derive the workers from the manager's objects; connect, reconnect, drain,
        drop."""
        if not self._started:
            return
        changed: list[WorkerCluster] = []
        left: list[WorkerCluster] = []
        in_use = self.in_use()
        with self._lock:
            desired = self._desired()
            wanted = {registration.name for registration in desired}
            for name, worker in list(self.workers.items()):
                if name in wanted:
                    continue
                if name in in_use and worker.connected:
                    if not worker.draining:
                        log.warning("worker %s left the registry while jobs are placed on "
                                    "it: draining (their copies there are deleted before "
                                    "they are placed elsewhere)", name)
                        worker.draining = True
                        left.append(worker)
                    continue
                log.info("worker %s removed from the registry", name)
                self.workers.pop(name).stop()
                left.append(worker)
            # A worker in use that is registered nowhere any more (say, a narrower
            # MultiKueueConfig at start): reach it through its MultiKueueCluster, if that
            # still exists, to drain it.
            for name in sorted(in_use - wanted - set(self.workers)):
                obj = self.clusters.get("", name)
                if obj is not None:
                    desired.append(self._registration(obj, len(desired)))
            for registration in desired:
                worker = self._refresh(registration, draining=registration.name not in wanted)
                if worker is not None:
                    changed.append(worker)
            self.secrets.retain(self._named)
        for worker in left:
            self.on_state_change(worker)
        for worker in changed:
            self._publish(worker)
            if worker.connected:
                self._probes.submit(self._probe, worker)

    def _refresh(self, registration: _Registration, draining: bool) -> WorkerCluster | None:
        """Bring one worker in line with its registration; the worker when it is new or
        reconnected (None when nothing changed)."""
        name = registration.name
        text = registration.kubeconfig
        fingerprint = hashlib.sha256(
            (text or registration.reason + registration.message).encode()).hexdigest()
        current = self.workers.get(name)
        if current is not None and current.fingerprint == fingerprint:
            current.order, current.created = registration.order, registration.created
            if current.draining and not draining:
                log.info("worker %s is registered again: no longer draining", name)
            current.draining = draining
            return None
        if current is not None:
            log.info("worker %s: kubeconfig changed; reconnecting", name)
            current.stop()
        worker = WorkerCluster(name=name, order=registration.order, fingerprint=fingerprint,
                               from_object=registration.from_object,
                               created=registration.created, draining=draining,
                               capacity=WorkerCapacity(name, self.config.node_scoring))
        self.workers[name] = worker
        reason, message = registration.reason, registration.message
        if text is not None:
            verdict = check_kubeconfig(text)
            if verdict.ok:
                self._connect(worker, verdict.config)
            else:
                reason, message = verdict.reason, verdict.message
        if not worker.connected:
            self._set_state(worker, False, reason, message)
            if reason != REASON_PENDING:
                log.warning("worker %s cannot be used: %s: %s", name, reason, message)
        return worker

    def release_drained(self) -> None:
        """Drop draining workers no job is placed on any more and that hold no copy of
        ours (the copy a job left behind when it moved after the worker-lost timeout goes
        with the garbage collector's next sweep, once the worker answers)."""
        with self._lock:
            in_use = self.in_use()
            done = [w for w in self.workers.values() if w.draining and (
                not w.connected or (w.name not in in_use and not w.cache(c.TRAINJOBS).keys()))]
            for worker in done:
                log.info("worker %s drained: removed from the registry", worker.name)
                self.workers.pop(worker.name).stop()

    def _connect(self, worker: WorkerCluster, kubeconfig: dict) -> None:
        worker.api = api_client(kubeconfig, qps=self.config.client.qps,
                                burst=self.config.client.burst,
                                request_timeout=self.config.client.timeout_seconds,
                                user_agent=c.DISPATCHER_USER_AGENT,
                                observer=self.observer(worker.name) if self.observer else None)
        custom = client.CustomObjectsApi(worker.api)
        core = client.CoreV1Api(worker.api)
        origin = f"{c.MULTIKUEUE_ORIGIN_LABEL}={self.config.origin}"
        sources = {
            c.TRAINJOBS: functools.partial(custom.list_cluster_custom_object, c.TRAINER_GROUP,
                                           c.TRAINER_VERSION, c.TRAINJOBS, label_selector=origin),
            c.TRAININGRUNTIMES: functools.partial(
                custom.list_cluster_custom_object, c.TRAINER_GROUP, c.TRAINER_VERSION,
                c.TRAININGRUNTIMES),
            c.CLUSTERTRAININGRUNTIMES: functools.partial(
                custom.list_cluster_custom_object, c.TRAINER_GROUP, c.TRAINER_VERSION,
                c.CLUSTERTRAININGRUNTIMES),
            "namespaces": core.list_namespace,
            "nodes": core.list_node,
            "pods": functools.partial(core.list_pod_for_all_namespaces,
                                      field_selector="status.phase!=Succeeded,status.phase!=Failed"),
        }
        for resource, list_fn in sources.items():
            informer = Informer(f"{worker.name}/{resource}", list_fn)
            informer.add_handler(functools.partial(self._worker_event, worker, resource))
            worker.informers[resource] = informer
            informer.start()
        if self.config.mode == "kueue":
            # Kept apart from the informers above: a worker without Kueue, or whose queues
            # the dispatcher may not read, is still a worker (placed by Node room).
            worker.quota = WorkerQuota(worker.name, worker.api, functools.partial(
                self.on_worker_event, worker.name))

    def _worker_event(self, worker: WorkerCluster, resource: str, kind: str,
                      old: dict | None, new: dict | None) -> None:
        if resource == "nodes":
            worker.capacity.on_node(kind, old, new)
        elif resource == "pods":
            worker.capacity.on_pod(kind, old, new)
        self.on_worker_event(worker.name, resource, kind, old, new)

    # --- probing and reporting ------------------------------------------------------

    def probe_all(self) -> None:
        self.release_drained()
        for worker in self.snapshot(draining=True):
            if worker.connected and worker.name not in self._probing:
                self._probing.add(worker.name)
                self._probes.submit(self._probe, worker)

    def _probe(self, worker: WorkerCluster) -> None:
        with logs.context(cluster=worker.name):
            self._probe_once(worker)

    def _probe_once(self, worker: WorkerCluster) -> None:
        try:
            try:
                client.VersionApi(worker.api).get_code(_request_timeout=self.probe_timeout)
                if worker.quota is not None:
                    worker.quota.ensure()
                # It answers: caches waiting out a backoff may reconnect right away.
                for informer in worker.informers.values():
                    informer.retry_now()
                unsynced = [i.name for i in worker.informers.values() if not i.synced.is_set()]
                broken = [i.name for i in worker.informers.values() if i.last_error]
                if unsynced or broken:
                    ok, message = False, "caches not in sync yet: " + ", ".join(
                        unsynced + broken)
                else:
                    ok, message = True, "connected"
            except Exception as err:  # noqa: BLE001 - any failure means not reachable
                ok, message = False, (f"cannot reach {worker.api.configuration.host}: "
                                      f"{describe_error(err)[:300]}")
            with self._lock:
                if self.workers.get(worker.name) is not worker:
                    return  # replaced or removed meanwhile
                changed, older = [], None
                if ok:
                    self._identify(worker)
                    # This worker may have been the older registration of a cluster another
                    # name already uses: that one stops now, not at its next probe.
                    for other in self._same_cluster_as(worker):
                        oldest = self._duplicate_of(other)
                        if other is not worker and other.active and oldest is not None:
                            self._refuse_duplicate(other, oldest)
                            changed.append(other)
                    older = self._duplicate_of(worker)
                if ok and older is not None:
                    if self._refuse_duplicate(worker, older):
                        changed.append(worker)
                elif self._set_state(worker, ok, REASON_ACTIVE if ok else
                                     REASON_CONNECTION_FAILED, message):
                    changed.append(worker)
            for each in changed:
                self._publish(each)
                self.on_state_change(each)
        finally:
            self._probing.discard(worker.name)

    def _identify(self, worker: WorkerCluster) -> None:
        namespace = worker.cache("namespaces").get("", IDENTITY_NAMESPACE)
        worker.identity = ((namespace or {}).get("metadata") or {}).get("uid") or (
            worker.api.configuration.host)  # an apiserver without kube-system: its URL
        self.identities[worker.name] = worker.identity

    def _same_cluster_as(self, worker: WorkerCluster) -> list[WorkerCluster]:
        """The registered (not draining) workers that share ``worker``'s identity."""
        if not worker.identity:
            return []
        return [w for w in self.workers.values()
                if w.identity == worker.identity and not w.draining]

    def _duplicate_of(self, worker: WorkerCluster) -> WorkerCluster | None:
        """The oldest other registration of ``worker``'s cluster, when it is older."""
        oldest = min(self._same_cluster_as(worker), key=lambda w: w.precedence, default=worker)
        return None if oldest is worker or worker.draining else oldest

    def _refuse_duplicate(self, worker: WorkerCluster, older: WorkerCluster) -> bool:
        """Report ``worker`` as a second registration of ``older``'s cluster; True when
        that changed its state."""
        message = (f"the same cluster as worker {older.name} ({IDENTITY_NAMESPACE} namespace "
                   f"UID {worker.identity}): only {older.name} is used; delete one of the two "
                   "registrations")
        first = worker.reason != REASON_DUPLICATE
        changed = self._set_state(worker, False, REASON_DUPLICATE, message)
        if first:
            log.warning("worker %s is refused: %s", worker.name, message)
            if self.recorder is not None and worker.from_object and self.may_write():
                obj = self.clusters.get("", worker.name)
                if obj is not None:
                    self.recorder.event(obj, "Warning", REASON_DUPLICATE, message)
        return changed

    def _set_state(self, worker: WorkerCluster, active: bool, reason: str, message: str) -> bool:
        if (worker.active, worker.reason) == (active, reason) and (active or worker.message == message):
            return False
        if worker.active != active:
            worker.since = time.time()
            log.log(logging.INFO if active else logging.WARNING,
                    "worker %s is %s: %s (%s)", worker.name, "active" if active else "inactive",
                    reason, message)
        worker.active, worker.reason, worker.message = active, reason, message
        return True

    def publish_all(self) -> None:
        """Write every worker's Active condition that differs, and the Events about
        registration problems (a new leader's first act)."""
        self.sync()
        for worker in self.snapshot():
            self._publish(worker)

    def _publish(self, worker: WorkerCluster) -> None:
        """Write the Active condition on the worker's MultiKueueCluster when it changed."""
        with self._publish_lock:
            if self.workers.get(worker.name) is worker:  # else a newer one speaks for it
                self._write_active(worker)

    def _write_active(self, worker: WorkerCluster) -> None:
        if worker.reason == REASON_PENDING:
            return  # no verdict yet: a transient "not read" would flap the condition
        if not worker.from_object or worker.draining or not self.may_write():
            return  # a draining worker is no registration of ours to report on
        if not self.publish_conditions():
            if not self._left_conditions:
                self._left_conditions = True
                log.info("Kueue runs on the manager: its MultiKueue controller writes the "
                         "MultiKueueCluster Active conditions; this dispatcher writes none")
            return
        self._left_conditions = False
        obj = self.clusters.get("", worker.name)
        if obj is None:
            return
        status = "True" if worker.active else "False"
        conditions = [dict(x) for x in (obj.get("status") or {}).get("conditions") or []]
        current = next((x for x in conditions if x.get("type") == ACTIVE), None)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == (
                status, worker.reason, worker.message):
            return
        stamp = format_time(worker.since)
        conditions = [x for x in conditions if x.get("type") != ACTIVE] + [{
            "type": ACTIVE, "status": status, "reason": worker.reason,
            "message": worker.message,
            "lastTransitionTime": stamp if current is None or current.get("status") != status
            else current.get("lastTransitionTime", stamp),
        }]
        try:
            written = client.CustomObjectsApi(self.manager).patch_cluster_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, worker.name,
                {"status": {"conditions": conditions}}, field_manager="trainjob-dispatcher",
                _content_type="application/merge-patch+json")
            self.clusters.observe(written)
        except Exception as err:  # noqa: BLE001 - reported again on the next change/probe
            log.warning("MultiKueueCluster %s: cannot write Active condition: %s",
                        worker.name, describe_error(err))
