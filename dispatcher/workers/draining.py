"""A worker that leaves the registry (its MultiKueueCluster deleted, the MultiKueueConfig
narrowed) while manager jobs are placed on it is kept as a *draining* connection: never a
candidate for placement, but reachable, so the reconciler can delete those jobs' copies
there and confirm they are gone before placing them elsewhere
(``standalone/worker_loss.py`` decides that per job). It is dropped once no job is placed
on it and no copy of the dispatcher's is left there.
"""

from __future__ import annotations

import logging

from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

log = logging.getLogger(__name__)


def drain_or_drop(workers: dict[str, WorkerCluster], wanted: set[str],
                  in_use: set[str]) -> list[WorkerCluster]:
    """Workers no registration wants any more: those jobs are placed on (and that are
    connected) start draining, the others are stopped and removed from ``workers``. The
    workers whose state changed."""
    left = []
    for name, worker in list(workers.items()):
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
        workers.pop(name).stop()
        left.append(worker)
    return left


def to_reach_again(workers: dict[str, WorkerCluster], wanted: set[str],
                   in_use: set[str]) -> list[str]:
    """Workers in use that are registered nowhere any more and not connected (say, a
    narrower MultiKueueConfig at start): to be reached through their MultiKueueCluster,
    if it still exists, and drained."""
    return sorted(in_use - wanted - set(workers))


def drop_drained(workers: dict[str, WorkerCluster], in_use: set[str]) -> None:
    """Drop draining workers no job is placed on any more and that hold no copy of
    ours (the copy a job left behind when it moved after the worker-lost timeout goes
    with the garbage collector's next sweep, once the worker answers)."""
    done = [w for w in workers.values() if w.draining and (
        not w.connected or (w.name not in in_use and not w.cache(c.TRAINJOBS).keys()))]
    for worker in done:
        log.info("worker %s drained: removed from the registry", worker.name)
        workers.pop(worker.name).stop()
