"""Whether each worker answers: probed every ``probe_interval`` seconds, each worker on
a thread of a small pool, so one that hangs holds up no other. A probe asks the
apiserver's version, wakes caches waiting out a backoff, and checks that every cache is in
sync; its verdict goes to the registry (``on_result``), which sets the worker's state.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from apscheduler.schedulers.background import BackgroundScheduler

from controller_kit import logs, writes
from controller_kit.kubeclient import describe_error
from controller_kit.manager import scheduler_thread
from dispatcher.workers.cluster import WorkerCluster

log = logging.getLogger(__name__)

# (worker, whether it answers with every cache in sync, what to say about it)
ProbeResult = Callable[[WorkerCluster, bool, str], None]


def probe(worker: WorkerCluster, timeout: float) -> tuple[bool, str]:
    """(True, "connected") when ``worker`` answers and its caches are in sync; else
    (False, why)."""
    try:
        # A plain GET: the generated call validates its arguments and builds a model of
        # the answer, several times the CPU, every probe interval, for every worker.
        writes.request_json(worker.api, "GET", "/version", None, timeout=timeout)
        if worker.quota is not None:
            worker.quota.ensure()
        # It answers: caches waiting out a backoff may reconnect right away.
        for informer in worker.informers.values():
            informer.retry_now()
        unsynced = [i.name for i in worker.informers.values() if not i.synced.is_set()]
        broken = [i.name for i in worker.informers.values() if i.last_error]
        if unsynced or broken:
            return False, "caches not in sync yet: " + ", ".join(unsynced + broken)
        return True, "connected"
    except Exception as err:  # noqa: BLE001 - any failure means not reachable
        return False, (f"cannot reach {worker.api.configuration.host}: "
                       f"{describe_error(err)[:300]}")


class Prober:
    """Runs ``each_round`` every ``interval`` seconds, and probes on its pool."""

    def __init__(self, interval: float, timeout: float, each_round: Callable[[], None],
                 on_result: ProbeResult):
        self.interval = interval
        self.timeout = timeout
        self.each_round = each_round
        self.on_result = on_result
        # Interval jobs only: UTC spares tzlocal guessing (and warning about) the zone.
        self._scheduler = BackgroundScheduler(daemon=True, timezone=datetime.UTC)
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="probe")
        self._probing: set[str] = set()

    def start(self) -> None:
        self._scheduler.add_job(self.each_round, "interval", seconds=self.interval,
                                id="probe-workers", max_instances=1, coalesce=True)
        self._scheduler.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The timer's thread, once started (its process's manager watches it). The pool's
        threads are not: a probe that raises ends in its future, never in its thread."""
        return scheduler_thread(self._scheduler)

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def probe_unless_probing(self, worker: WorkerCluster) -> None:
        """Probe ``worker`` (connected) unless a probe of it is under way."""
        if worker.connected and worker.name not in self._probing:
            self._probing.add(worker.name)
            self._pool.submit(self._probe, worker)

    def probe_now(self, worker: WorkerCluster) -> None:
        """Probe ``worker`` (new or reconnected) at once."""
        self._pool.submit(self._probe, worker)

    def _probe(self, worker: WorkerCluster) -> None:
        with logs.context(cluster=worker.name):
            try:
                ok, message = probe(worker, self.timeout)
                self.on_result(worker, ok, message)
            except Exception:  # else lost in the pool's future, unseen
                log.exception("worker %s: taking in its probe's verdict failed", worker.name)
            finally:
                self._probing.discard(worker.name)
