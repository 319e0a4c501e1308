"""A work queue of object keys with the semantics controllers rely on.

* A key waiting in the queue is held once, however often it is added (events coalesce).
* A key is never handed to two workers at once; added while being processed, it is queued
  again when the worker calls ``done``.
* ``add_after`` delays a key; ``add_rate_limited`` delays it with per-key exponential
  backoff (reset by ``forget``), so a failing object is retried without hot-looping.
* With ``metrics`` (``controller_kit.controller_metrics.QueueMetrics``) it reports its depth, adds,
  waiting and processing times and retries as client-go's work queues do.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller_kit.controller_metrics import QueueMetrics


class ShutDown(Exception):
    """``get`` on a queue that was shut down."""


class WorkQueue:
    def __init__(self, base_delay: float = 0.05, max_delay: float = 60.0,
                 metrics: QueueMetrics | None = None):
        self._lock = threading.Condition()
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._counter = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._shutting_down = False
        self._metrics = metrics
        # Per worker thread: how long the key it took last had waited (``waited``).
        self._taken = threading.local()

    def instrument(self, metrics: QueueMetrics) -> None:
        """Report to ``metrics`` from now on (for a queue made by code that does not know
        the process's metrics); keys already waiting count as added now."""
        with self._lock:
            self._metrics = metrics
            for key in self._dirty:
                metrics.added(key)

    def _mark_dirty(self, key: Hashable) -> None:
        """``key`` is due and was not waiting: queue it unless a worker holds it (then
        ``done`` queues it). Called with the lock held."""
        self._dirty.add(key)
        if self._metrics is not None:
            self._metrics.added(key)
        if key not in self._processing:
            self._queue.append(key)
            self._lock.notify()

    def add(self, key: Hashable) -> None:
        with self._lock:
            if self._shutting_down or key in self._dirty:
                return
            self._mark_dirty(key)

    def add_after(self, key: Hashable, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed (a retry, in the metrics)."""
        with self._lock:
            if self._shutting_down:
                return
            if self._metrics is not None:
                self._metrics.retried()
            if delay > 0:
                heapq.heappush(self._delayed,
                               (time.monotonic() + delay, next(self._counter), key))
                self._lock.notify()
                return
        self.add(key)

    def add_rate_limited(self, key: Hashable) -> float:
        """Requeue ``key`` after its next backoff delay; returns that delay."""
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self._base_delay * (2 ** failures), self._max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)

    def _promote_due(self) -> float | None:
        """Move due delayed keys into the queue; return seconds until the next one."""
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            if key not in self._dirty:
                self._mark_dirty(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> Hashable:
        """The next key to process; raises ``ShutDown`` once shut down, ``TimeoutError``
        when ``timeout`` passes with nothing to do."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                wait = self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    self._taken.waited = self._metrics.taken(key) \
                        if self._metrics is not None else None
                    return key
                if self._shutting_down:
                    raise ShutDown()
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError()
                    wait = remaining if wait is None else min(wait, remaining)
                self._lock.wait(wait)

    def waited(self) -> float | None:
        """Seconds the key this thread took last had waited since it was added (None when
        the queue reports no metrics, or this thread took none)."""
        return getattr(self._taken, "waited", None)

    def done(self, key: Hashable) -> None:
        with self._lock:
            self._processing.discard(key)
            if self._metrics is not None:
                self._metrics.done(key)
            if key in self._dirty:
                self._queue.append(key)
                self._lock.notify()

    def shutdown(self) -> None:
        with self._lock:
            self._shutting_down = True
            self._lock.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)
