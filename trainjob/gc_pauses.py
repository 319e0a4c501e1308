"""The interpreter's cyclic garbage collector in a controller process: every collection
timed, and the long-lived objects kept out of the collections that would stop the process
for a long time.

CPython's collector holds the interpreter lock while it walks the objects of the
generations it collects, so every thread waits: reconciles in flight, watches, the HTTP
answers being read. A controller's objects are mostly its informer caches (a tree of
dicts and lists per cached object), and they are long-lived, so they sit in the oldest
generation, which a full collection walks whole. With a few thousand TrainJobs cached, a
full collection takes tens to hundreds of milliseconds on a busy machine, and it comes
again each time a quarter as many objects as survived the last one have survived since
(the interpreter's rule). Under a steady stream of jobs that is every few seconds to
minutes, and each stall shows as a latency spike in every job in flight.

So after each full collection its survivors are frozen (``gc.freeze``): moved where no
later collection walks. Each later full collection walks only what was created since.
Once a controller's caches have synced, ``sweep`` freezes what they hold at once.
Freezing does not keep anything alive: a frozen object is still freed by reference
counting, which is how a replaced cache entry goes. What a frozen object escapes is the
cycle detector, so a frozen object that later becomes part of an unreachable cycle would
stay. To bound that, every ``sweep_seconds`` the frozen objects are handed back and one
full collection walks everything (``sweep``), logged with what it reclaimed.

Each collection's duration goes to ``python_gc_duration_seconds{generation}``, beside the
``python_gc_*`` counters of prometheus_client's own collector.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

from prometheus_client import CollectorRegistry, Histogram

from trainjob.controller_metrics import children

log = logging.getLogger(__name__)

OLDEST = 2  # CPython's generations are 0, 1 and 2; a collection of 2 is a full one.
PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)
SWEEP_SECONDS = 1800.0


class GcPauses:
    """Installed once per process (``install``); ``uninstall`` undoes it (for tests)."""

    def __init__(self, registry: CollectorRegistry, sweep_seconds: float = SWEEP_SECONDS,
                 freeze: bool = True):
        self._duration = children(Histogram(
            "python_gc_duration_seconds", "How long each garbage collection held the "
            "interpreter, by generation", ["generation"], registry=registry,
            buckets=PAUSE_BUCKETS))
        self._freeze = freeze
        self._sweep_seconds = sweep_seconds
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeper: int | None = None  # the thread sweeping, while it does
        self.last: dict = {}

    def install(self) -> GcPauses:
        if self._callback in gc.callbacks:
            return self
        gc.callbacks.append(self._callback)
        if self._freeze and self._sweep_seconds > 0:
            self._thread = threading.Thread(target=self._sweeps, name="gc-sweep", daemon=True)
            self._thread.start()
        return self

    def uninstall(self) -> None:
        self._stop.set()
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._thread is not None:
            self._thread.join(5)
        gc.unfreeze()

    def _callback(self, phase: str, info: dict) -> None:
        # Called by the interpreter, in whichever thread triggered the collection: no
        # collection can start inside it, so it may observe and freeze without a guard.
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        generation = info["generation"]
        self._duration(str(generation)).observe(seconds)
        self.last = {"generation": generation, "seconds": seconds,
                     "collected": info["collected"]}
        # Not while another thread sweeps: its collection is to walk everything.
        if self._freeze and generation == OLDEST and \
                self._sweeper in (None, threading.get_ident()):
            gc.freeze()

    def sweep(self) -> dict:
        """Hand the frozen objects back and collect everything once: what it took, what it
        found unreachable (objects that became garbage while frozen, and any new) and how
        many objects it froze. Then one more collection, which walks only what was created
        meanwhile: the interpreter times the next full collection by how many objects
        survived the last one, and that count is then small, so the next comes soon and
        walks little, instead of after a quarter of everything again."""
        self._sweeper = threading.get_ident()
        try:
            gc.unfreeze()
            gc.collect()
            swept = {**self.last, "frozen": gc.get_freeze_count()}
            gc.collect()
        finally:
            self._sweeper = None
        log.info("full garbage collection: %.1f ms, %d unreachable objects reclaimed, %d "
                 "objects frozen", swept["seconds"] * 1000, swept["collected"],
                 swept["frozen"])
        return swept

    def _sweeps(self) -> None:
        while not self._stop.wait(self._sweep_seconds):
            self.sweep()
