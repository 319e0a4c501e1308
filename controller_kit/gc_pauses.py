"""The interpreter's cyclic garbage collector in a controller process: every collection
timed, and the long-lived objects kept out of the collections that would stop the process
for a long time.

CPython's collector holds the interpreter lock while it walks the objects of the
generations it collects, so every thread waits: reconciles in flight, watches, the HTTP
answers being read. A controller's objects are mostly its informer caches (a tree of
dicts and lists per cached object), and they are long-lived, so they sit in the oldest
generation, which a full collection walks whole. With a few thousand TrainJobs cached, a
full collection takes tens to hundreds of milliseconds on a busy machine, and it comes
again each time a quarter as many objects as survived the last one have survived since,
and at least ten younger collections later (the interpreter's rule). Under a steady
stream of jobs that is every few seconds to minutes, and each stall shows as a latency
spike in every job in flight.

So after each full collection its survivors are frozen (``gc.freeze``): moved where no
later collection walks. Each later full collection walks only what was created since.
Once a controller's caches have synced, ``sweep`` freezes what they hold at once.
Freezing does not keep anything alive: a frozen object is still freed by reference
counting, which is how a replaced cache entry goes. What a frozen object escapes is the
cycle detector, so a frozen object that later becomes part of an unreachable cycle would
stay: objects in flight when a full collection ends (an answer being read, an exception
being handled) are frozen too. To bound that, every ``sweep_seconds`` the frozen objects
are handed back and one full collection walks everything (``sweep``), logged with what it
reclaimed: the bound is in time, and the log shows how much it was.

That walk is the stall freezing avoids, once: on a two-core machine, a dispatcher's took
102 ms with no job cached and 338 ms with 20,000 mirrored (each cached on the manager and
on a worker), and the jobs in flight waited for it. What it finds is little: after 30
minutes of 10 new jobs a second, 48 unreachable objects. So the default is every 6 hours,
and ``--python-gc-sweep-interval`` trades the one for the other (0: never).

Frozen objects are also out of sight of ``gc.get_objects`` and ``gc.get_referrers``:
memory debugging that walks them sees only what was created since the last full
collection.

Each collection's duration goes to ``python_gc_duration_seconds{generation}``, beside the
``python_gc_*`` counters of prometheus_client's own collector.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

from prometheus_client import CollectorRegistry, Histogram

from controller_kit.controller_metrics import children

log = logging.getLogger(__name__)

OLDEST = 2  # CPython's generations are 0, 1 and 2; a collection of 2 is a full one.
PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)
SWEEP_SECONDS = 6 * 3600.0


class GcPauses:
    """Installed once per process (``install``); ``uninstall`` undoes it, every freeze
    included (for tests)."""

    def __init__(self, registry: CollectorRegistry, sweep_seconds: float = SWEEP_SECONDS):
        self._duration = children(Histogram(
            "python_gc_duration_seconds", "How long each garbage collection held the "
            "interpreter, by generation", ["generation"], registry=registry,
            buckets=PAUSE_BUCKETS))
        # Every child made now: making one takes the metric's lock and allocates, and an
        # allocation under that lock (a scrape copies the children) may start a
        # collection in the same thread, whose callback must not wait for that lock.
        for generation in range(OLDEST + 1):
            self._duration(str(generation))
        self._sweep_seconds = sweep_seconds
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> GcPauses:
        if self._callback in gc.callbacks:
            return self
        gc.callbacks.append(self._callback)
        if self._sweep_seconds > 0:
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
        # Called by the interpreter, in whichever thread triggered the collection, once
        # the collection's lists are consistent again; no collection can start inside it.
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self._duration(str(generation)).observe(time.perf_counter() - self._started)
        if generation == OLDEST:
            gc.freeze()

    def sweep(self, attempts: int = 5) -> dict | None:
        """Hand the frozen objects back and collect everything once: what it took, what it
        found unreachable (objects that became garbage while frozen, and any new) and how
        many objects it froze. Then one more collection, which walks only what was created
        meanwhile: the interpreter times the next full collection by how many objects
        survived the last one, and that count is then small, so the next comes soon and
        walks little, instead of after a quarter of everything again. None when another
        thread's collection kept it from collecting ``attempts`` times."""
        for _ in range(attempts):
            done = gc.get_stats()[OLDEST]["collections"]
            gc.unfreeze()
            started = time.perf_counter()
            collected = gc.collect()
            seconds = time.perf_counter() - started
            # gc.collect() returns at once, collecting nothing, while another thread is
            # collecting; a full collection by anyone since the unfreeze walked everything.
            if gc.get_stats()[OLDEST]["collections"] > done:
                swept = {"seconds": seconds, "collected": collected,
                         "frozen": gc.get_freeze_count()}
                gc.collect()
                log.info("full garbage collection: %.1f ms, %d unreachable objects "
                         "reclaimed, %d objects frozen", seconds * 1000, collected,
                         swept["frozen"])
                return swept
            self._stop.wait(0.01)
        log.warning("full garbage collection skipped: another thread was collecting")
        return None

    def _sweeps(self) -> None:
        while not self._stop.wait(self._sweep_seconds):
            try:
                self.sweep()
            except Exception:  # the next sweep must still come
                log.exception("full garbage collection failed")
