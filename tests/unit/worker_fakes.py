"""Stand-ins for the reading side of a worker's informers and the registry, for the pure
tests of placement (no cluster behind them)."""

from __future__ import annotations

import threading


class Cache:
    """An informer's reading side, filled by the test."""

    def __init__(self, *objs, synced=True, error=None):
        self.store = {((o["metadata"].get("namespace") or ""), o["metadata"]["name"]): o
                      for o in objs}
        self.synced = threading.Event()
        self.current = threading.Event()
        if synced:
            self.synced.set()
            self.current.set()
        self.last_error = error
        self.name = "cache"

    def get(self, namespace, name):
        return self.store.get((namespace or "", name))

    def stop(self, timeout=None):
        pass


class Registry:
    def __init__(self, *workers):
        self.workers = {w.name: w for w in workers}

    def snapshot(self):
        return sorted(self.workers.values(), key=lambda w: w.order)

    def get(self, name):
        return self.workers.get(name)
