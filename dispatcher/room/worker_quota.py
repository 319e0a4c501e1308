"""A worker's Kueue queues, read for kueue mode: its LocalQueues and ClusterQueues, cached by
two watches (never a GET per decision), and the quota this dispatcher's nominations hold
there until the worker's Kueue reserves it.

Whether the worker serves Kueue's API is asked by discovery when its connection is probed
(again every ``KUEUE_RECHECK_SECONDS`` while it does not, so a Kueue installed later is picked
up). A worker that does not serve it, or whose queues cannot be read (the dispatcher's
identity there may not list them), is placed by its Node room only; one that serves it but
whose caches are still on their first list is not a candidate until they are (seconds), so
no nomination is made on a quota not yet seen.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.informer import Informer
from controller_kit.kubeclient import describe_error
from dispatcher.config import KUEUE_RECHECK_SECONDS
from dispatcher.room import kueue_quota as kq
from dispatcher.room.amounts import format_amount
from trainjob import constants as c

log = logging.getLogger(__name__)

CLUSTERQUEUES = "clusterqueues"
LOCALQUEUES = "localqueues"
DISCOVERY_TIMEOUT = 10.0  # the probe's thread waits for it

JobKey = tuple[str, str]
Resources = dict[str, Decimal]


@dataclass(frozen=True)
class QuotaRow:
    """One flavor and resource of a ClusterQueue: its nominal quota, what the worker's Kueue
    reserved, what nominations not reserved yet hold here, and what is left (None: this
    ClusterQueue sets no limit, by borrowing without a borrowingLimit)."""

    flavor: str
    resource: str
    nominal: Decimal
    reserved: Decimal
    held: Decimal
    free: Decimal | None


class WorkerQuota:
    """The Kueue queues of one worker and the quota pending on them; thread-safe."""

    def __init__(self, worker: str, api: client.ApiClient,
                 on_change: Callable[[str, str, dict | None, dict | None], None],
                 recheck: float = KUEUE_RECHECK_SECONDS):
        self.worker = worker
        self.api = api
        self.on_change = on_change
        self.recheck = recheck
        self.informers: dict[str, Informer] = {}
        self.served: bool | None = None  # None until discovery has answered
        self._checked = 0.0
        self._lock = threading.Lock()
        self._pending: dict[JobKey, tuple[tuple[str, str], Resources]] = {}
        self._said: str | None = None

    # --- discovery and caches -----------------------------------------------------------

    def ensure(self) -> None:
        """Start the caches once the worker serves Kueue's queues (asked by discovery at
        most every ``recheck`` seconds until it does). Called from the worker's probe."""
        if self.informers or time.monotonic() - self._checked < self.recheck:
            return
        self._checked = time.monotonic()
        try:
            resources = client.CustomObjectsApi(self.api).get_api_resources(
                c.KUEUE_GROUP, c.KUEUE_VERSION, _request_timeout=DISCOVERY_TIMEOUT)
            names = {r.name for r in resources.resources or []}
            served = {CLUSTERQUEUES, LOCALQUEUES} <= names
        except ApiException as err:
            if err.status != 404:
                log.debug("worker %s: Kueue discovery failed: %s", self.worker,
                          describe_error(err))
                self._checked = 0.0  # ask again at the next probe
                return
            served = False
        except Exception as err:  # noqa: BLE001 - unreachable: the next probe asks again
            log.debug("worker %s: Kueue discovery failed: %s", self.worker, describe_error(err))
            self._checked = 0.0
            return
        if served != self.served:
            log.info("worker %s %s Kueue's queues (%s/%s %s, %s)", self.worker,
                     "serves" if served else "does not serve", c.KUEUE_GROUP, c.KUEUE_VERSION,
                     CLUSTERQUEUES, LOCALQUEUES)
        self.served = served
        if served:
            self._start()

    def _start(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        for plural in (CLUSTERQUEUES, LOCALQUEUES):
            informer = Informer(f"{self.worker}/{plural}", functools.partial(
                custom.list_cluster_custom_object, c.KUEUE_GROUP, c.KUEUE_VERSION, plural))
            informer.add_handler(functools.partial(self._event, informer, plural))
            informer.add_synced_handler(functools.partial(self.on_change, plural, "SYNCED",
                                                          None, None))
            self.informers[plural] = informer
            informer.start()

    def _event(self, informer: Informer, plural: str, kind: str, old: dict | None,
               new: dict | None) -> None:
        # Before the first list is complete the synced handler speaks for all of it.
        if informer.synced.is_set():
            self.on_change(plural, kind, old, new)

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop(timeout=1)

    def unreadable(self) -> str | None:
        """Why the quota is not read (the worker is then placed by Node room only), or
        None when it is."""
        if self.served is None:
            return "Kueue's API not asked about yet"
        if not self.served:
            return (f"Kueue's API ({c.KUEUE_GROUP}/{c.KUEUE_VERSION} {CLUSTERQUEUES}, "
                    f"{LOCALQUEUES}) is not served")
        broken = [f"{i.name}: {i.last_error}" for i in self.informers.values()
                  if i.last_error and not i.synced.is_set()]
        return f"Kueue's queues cannot be read ({'; '.join(broken)})" if broken else None

    def syncing(self) -> bool:
        return bool(self.informers) and not all(
            i.synced.is_set() for i in self.informers.values())

    # --- the room for one job -------------------------------------------------------------

    def verdict(self, queue: tuple[str, str], requests: Resources, pods: int,
                job: JobKey) -> kq.QuotaVerdict | None:
        """Whether the job fits the quota of the ClusterQueue behind LocalQueue ``queue``
        (namespace, name); None when the quota is not read (Node room only)."""
        if why := self.unreadable():
            self._say(why)
            return None
        if self.syncing():
            return kq.QuotaVerdict(f"Kueue's queues on {self.worker} not read yet",
                                   unknown=True)
        self._say(None)
        namespace, name = queue
        local = self.informers[LOCALQUEUES].get(namespace, name)
        if local is None:
            return kq.QuotaVerdict(
                f"LocalQueue {namespace}/{name} (the Workload's spec.queueName) not found: "
                "this worker's Kueue would not admit it")
        cq_name = (local.get("spec") or {}).get("clusterQueue") or ""
        cluster_queue = self.informers[CLUSTERQUEUES].get("", cq_name)
        if cluster_queue is None:
            return kq.QuotaVerdict(
                f"ClusterQueue {cq_name or '(none)'} (LocalQueue {namespace}/{name} "
                "spec.clusterQueue) not found: this worker's Kueue would not admit it")
        room = self._room(cluster_queue, but=job)
        return kq.fit(room, kq.wanted(room, requests, pods),
                      f"ClusterQueue {cq_name} (LocalQueue {namespace}/{name})")

    def _room(self, cluster_queue: dict, but: JobKey | None = None) -> kq.QuotaRoom:
        """A ClusterQueue's room less the nominations held on it (but ``but``'s own)."""
        room = kq.quota_room(cluster_queue)
        with self._lock:
            pending = [(queue, asked) for key, (queue, asked) in self._pending.items()
                       if key != but]
        for queue, asked in pending:
            local = self.informers[LOCALQUEUES].get(*queue)
            if local and (local.get("spec") or {}).get("clusterQueue") == room.cluster_queue:
                kq.take(room, asked)
        return room

    def _say(self, why: str | None) -> None:
        """Log once each time the quota stops (or starts) being read."""
        if why != self._said:
            if why:
                log.warning("worker %s: %s; its Node room alone decides", self.worker, why)
            elif self._said:
                log.info("worker %s: Kueue's queues are read again", self.worker)
            self._said = why

    def summary(self) -> dict:
        """What the dashboard shows: each ClusterQueue's quota per flavor and resource
        (nominal, reserved by the worker's Kueue, held for nominations it has not reserved
        yet, free), or why the quota is not read."""
        queues = self.by_cluster_queue()
        if isinstance(queues, str):
            return {"read": False, "why": queues, "clusterQueues": []}
        return {"read": True, "why": None, "clusterQueues": [
            {"name": name, "resources": [
                {"flavor": row.flavor, "resource": row.resource,
                 **{part: format_amount(row.resource, getattr(row, part))
                    for part in ("nominal", "reserved", "held")},
                 "free": "no limit" if row.free is None
                 else format_amount(row.resource, row.free)}
                for row in rows]}
            for name, rows in queues.items()]}

    def by_cluster_queue(self) -> dict[str, list[QuotaRow]] | str:
        """Each ClusterQueue's quota rows by name (the dashboard's and the
        ``dispatcher_worker_quota_free`` metric's one source), or why it is not read."""
        if why := self.unreadable():
            return why
        if self.syncing():
            return "Kueue's queues not read yet"
        queues = {}
        for cluster_queue in sorted(self.informers[CLUSTERQUEUES].list(),
                                    key=lambda obj: obj["metadata"]["name"]):
            room = self._room(cluster_queue)
            queues[room.cluster_queue] = [
                QuotaRow(flavor.name, resource, flavor.nominal[resource],
                         flavor.reserved.get(resource, Decimal(0)),
                         flavor.pending.get(resource, Decimal(0)), flavor.free(resource))
                for _, flavors in room.groups for flavor in flavors
                for resource in sorted(flavor.nominal)]
        return queues

    # --- nominations not reserved on the worker yet -------------------------------------

    def hold(self, job: JobKey, queue: tuple[str, str], requests: Resources,
             pods: int) -> None:
        """Count the job against its queue's quota here until ``release``: it is nominated
        to this worker and the worker's Kueue has not reserved quota for it yet. Only
        ``reservations.Reservations`` calls this and ``release``."""
        asked = {r: a for r, a in requests.items() if a > 0}
        if pods:
            asked[kq.PODS] = Decimal(pods)  # charged only where the ClusterQueue covers pods
        with self._lock:
            self._pending[job] = (queue, asked)

    def release(self, job: JobKey) -> bool:
        with self._lock:
            return self._pending.pop(job, None) is not None
