"""Connecting to a worker: its API client (rate-limited, with the dispatcher's user agent)
and the caches the dispatcher reads there, each feeding the worker's room
(``WorkerCapacity``) and then the dispatcher's handler; in Kueue mode also the reader of
its Kueue's queues (``WorkerQuota``)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from kubernetes import client

from controller_kit.informer import Informer
from controller_kit.kubeclient import api_client
from dispatcher.config import DispatcherConfig
from dispatcher.room.worker_quota import WorkerQuota
from dispatcher.workers import projections
from dispatcher.workers.cluster import RELISTED, ROOM_CACHES, WorkerCluster, WorkerEvent
from dispatcher.workers.warning_events import WarningEvents
from trainjob import constants as c

log = logging.getLogger(__name__)
# The caches of one worker list on threads of their own: one of them says they all did.
_SYNCED_LOCK = threading.Lock()

# cluster name -> request observer for its client (the metrics of its API requests)
Observer = Callable[[str], Callable[[str, str], None]]
# What is kept of each object of the resources a large worker has many of.
PROJECTIONS = {"nodes": projections.node, "pods": projections.pod}


def connect(worker: WorkerCluster, kubeconfig: dict, config: DispatcherConfig,
            observer: Observer | None, on_event: WorkerEvent) -> None:
    """Open ``worker``'s client from ``kubeconfig`` and start its caches."""
    worker.api = api_client(kubeconfig, qps=config.client.qps, burst=config.client.burst,
                            request_timeout=config.client.timeout_seconds,
                            user_agent=c.DISPATCHER_USER_AGENT,
                            observer=observer(worker.name) if observer else None)
    custom = client.CustomObjectsApi(worker.api)
    core = client.CoreV1Api(worker.api)
    origin = f"{c.MULTIKUEUE_ORIGIN_LABEL}={config.origin}"
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
    connected = time.monotonic()
    for resource, list_fn in sources.items():
        informer = Informer(f"{worker.name}/{resource}", list_fn,
                            transform=PROJECTIONS.get(resource))
        informer.add_handler(functools.partial(_route, worker, resource, on_event))
        informer.add_synced_handler(functools.partial(_synced, worker, connected))
        if resource in ROOM_CACHES:
            informer.add_synced_handler(functools.partial(
                on_event, worker.name, resource, RELISTED, None, None))
        worker.informers[resource] = informer
    if config.mirror_worker_events:
        # Kept apart from the caches above: read per namespace as copies come (the
        # dispatcher's, or Kueue's in Kueue mode), never waited for (nothing is placed by
        # them), and on a client with a rate limit of its own: a worker's Events, however
        # many, never wait for nor hold up the requests its caches and the copies' status
        # make on the client above.
        events_api = api_client(
            kubeconfig, qps=config.worker_event_qps,
            burst=config.worker_event_burst or max(1, int(2 * config.worker_event_qps)),
            request_timeout=config.client.timeout_seconds,
            user_agent=c.DISPATCHER_USER_AGENT,
            observer=observer(worker.name) if observer else None,
            pool_size=config.worker_event_watches + 2)  # the watches, the lister, a list
        worker.warnings = WarningEvents(
            worker.name, events_api, on_event, max_watches=config.worker_event_watches,
            list_period=config.worker_event_list_seconds)
        worker.informers[c.TRAINJOBS].add_handler(worker.warnings.follow_copy)
        worker.informers["namespaces"].add_handler(worker.warnings.follow_namespace)
    for informer in worker.informers.values():
        informer.start()
    if config.mode == "kueue":
        # Kept apart from the informers above: a worker without Kueue, or whose queues
        # the dispatcher may not read, is still a worker (placed by Node room).
        worker.quota = WorkerQuota(worker.name, worker.api, functools.partial(
            on_event, worker.name))


def _synced(worker: WorkerCluster, connected: float) -> None:
    """The first time every cache of the worker has listed: say how long that took and
    how much it holds (a restart, a failover and a new worker all wait for this)."""
    with _SYNCED_LOCK:
        if worker.cache_sync_seconds is not None or not all(
                informer.synced.is_set() for informer in worker.informers.values()):
            return
        worker.cache_sync_seconds = time.monotonic() - connected
    log.info("worker %s: caches synced in %.1f s (%d Nodes, %d Pods)", worker.name,
             worker.cache_sync_seconds, len(worker.informers["nodes"]),
             len(worker.informers["pods"]))


def _route(worker: WorkerCluster, resource: str, on_event: WorkerEvent, kind: str,
           old: dict | None, new: dict | None) -> None:
    """Nodes and pods change the worker's room first; then the dispatcher hears of those
    that changed it (a Node's heartbeat, a Pod's status conditions do not: on a large
    worker they are most of the events)."""
    if resource == "nodes" and not worker.capacity.on_node(kind, old, new):
        return
    if resource == "pods" and not worker.capacity.on_pod(kind, old, new):
        return
    on_event(worker.name, resource, kind, old, new)
