"""Standalone mode's per-job timings for metrics and the dashboard: when a job became
eligible for dispatch (the start of the dispatch-latency histogram) and when a worker's
status change was seen (the start of the status-sync-lag histogram). Observability only:
no decision reads them.
"""

from __future__ import annotations

import time

from dispatcher.metrics import DispatcherMetrics

JobKey = tuple[str, str]


class JobTimings:
    def __init__(self, metrics: DispatcherMetrics):
        self.metrics = metrics
        self._eligible_since: dict[JobKey, float] = {}
        # When a worker's status change was seen and not yet written: (monotonic, wall).
        self._remote_changed_at: dict[JobKey, tuple[float, float]] = {}
        self._last_sync_lag: dict[JobKey, float] = {}

    def eligible(self, key: JobKey) -> None:
        self._eligible_since.setdefault(key, time.monotonic())

    def dispatched(self, key: JobKey) -> None:
        started = self._eligible_since.pop(key, None)
        if started is not None:
            self.metrics.dispatch_latency.observe(time.monotonic() - started)

    def remote_changed(self, key: JobKey) -> None:
        # Both clocks: the monotonic one for the lag, the wall one for a log line that a
        # reader joins with other processes' clocks (the benchmark's watches).
        self._remote_changed_at.setdefault(key, (time.monotonic(), time.time()))

    def in_sync(self, key: JobKey) -> None:
        """Nothing waits to be mirrored (e.g. it was written before a restart)."""
        self._remote_changed_at.pop(key, None)

    def mirrored(self, key: JobKey) -> float | None:
        """The status seen changed on the worker is written on the manager: observe the
        lag; the wall-clock time the change was seen, or None when none was waiting."""
        changed_at = self._remote_changed_at.pop(key, None)
        if changed_at is None:
            return None
        lag = time.monotonic() - changed_at[0]
        self.metrics.sync_lag.observe(lag)
        self._last_sync_lag[key] = lag
        return changed_at[1]

    def forget(self, key: JobKey) -> None:
        for per_job in (self._eligible_since, self._remote_changed_at, self._last_sync_lag):
            per_job.pop(key, None)

    def sync_lag(self, namespace: str, name: str) -> tuple[float | None, float | None]:
        """(seconds the last mirrored status change took to reach the manager, seconds a
        worker status change has been waiting to be written there); None when not known
        or nothing waits."""
        key = (namespace, name)
        waiting_since = self._remote_changed_at.get(key)
        return self._last_sync_lag.get(key), (
            time.monotonic() - waiting_since[0] if waiting_since is not None else None)
